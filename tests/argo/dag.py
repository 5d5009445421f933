"""A DAG template, as workflow/controller/dag.go runs it (v4.0.10).

- A task waits until every task its `depends` names is fulfilled (evaluateDependsLogic: proceed);
  then `depends` decides execute or Omitted ("omitted: depends condition not met").
- Its references are resolved from the workflow's globals and the outputs of its *ancestors* only
  (buildLocalScopeFromTask, common.GetTaskAncestry); a skipped/omitted ancestor contributes its
  declared output parameters' `valueFrom.default`, else an absent optional (scope.go
  addSkippedNodeOutputsToScope). `when` is substituted first with tags under `tasks.` strict
  (resolveDependencyReferences: a missing one requeues the task forever) and evaluated by govaluate;
  false -> Skipped ("when '...' evaluated false"). Then the arguments; artifacts given `from` are
  resolved from the scope (scope.resolveArtifact).
- The DAG's phase: assessDAGPhase over the leaf tasks (findLeafTaskNames), a skipped/omitted task
  inheriting its branch's phase, Failed/Error first (failFast, the default).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tests.argo.exprs import ExprError, depends_tasks, eval_depends, eval_when
from tests.argo.nodes import Node
from tests.argo.spec import Arguments, Artifact, DAGTask, Parameter, Template
from tests.argo.substitute import AbsentOptional, Scope, Unresolved, replace

if TYPE_CHECKING:
    from tests.argo.engine import Controller


def run_dag(ctl: Controller, name: str, tmpl: Template, on_exit: bool) -> Node:
    from tests.argo.engine import ABSENT, EngineStuck

    tasks = {t.name: t for t in tmpl.dag.tasks}
    deps = {t.name: depends_tasks(t.depends) if t.depends else [] for t in tmpl.dag.tasks}
    dag_node = Node(name, tmpl.name, "Running", started=ctl.clock.now())
    nodes: dict[str, Node] = {}
    running: dict[str, threading.Thread] = {}
    changed = threading.Condition()

    failures: list[BaseException] = []

    def start(task: DAGTask, args: Arguments) -> None:
        def run() -> None:
            try:
                node = ctl.execute(f"{name}.{task.name}", task.template, args, on_exit=on_exit, task=task.name)
            except BaseException as exc:  # NotEmulated, EngineStuck...: the test must see it, not hang
                with changed:
                    failures.append(exc)
                    running.pop(task.name, None)
                    changed.notify_all()
                return
            with changed:
                nodes[task.name] = node
                running.pop(task.name, None)
                changed.notify_all()
        thread = threading.Thread(target=run, name=f"argo-{task.name}", daemon=True)
        running[task.name] = thread
        thread.start()

    def settle(task: DAGTask, phase: str, message: str) -> None:
        nodes[task.name] = ctl._record(Node(f"{name}.{task.name}", task.template, phase, message,
                                            ctl.clock.now(), ctl.clock.now()))

    with changed:
        while len(nodes) < len(tasks):
            if failures:
                raise failures[0]
            progressed = False
            for task in tmpl.dag.tasks:
                if task.name in nodes or task.name in running:
                    continue
                if any(d not in nodes for d in deps[task.name]):
                    continue  # proceed == false: a dependency is not fulfilled yet
                progressed = True
                if task.depends:
                    try:
                        execute = eval_depends(task.depends, {d: nodes[d].phase for d in deps[task.name]})
                    except ExprError as exc:
                        settle(task, "Error", f"unable to evaluate expression '{task.depends}': {exc}")
                        continue
                    if not execute:
                        settle(task, "Omitted", "omitted: depends condition not met")
                        continue
                scope, artifacts = _task_scope(ctl, tmpl, task.name, tasks, deps, nodes)
                try:
                    when = replace(task.when or "", scope, strict=("tasks", "steps"))
                    if not eval_when(when):
                        settle(task, "Skipped", f"when '{when}' evaluated false")
                        continue
                    args = _resolve_args(task, scope, artifacts, ABSENT)
                except Unresolved as exc:
                    raise EngineStuck(f"task {task.name}: {exc}; Argo requeues it forever (the workflow never "
                                      "finishes): reference only outputs of tasks it depends on") from None
                except (AbsentOptional, ExprError, ValueError) as exc:
                    settle(task, "Error", str(exc))
                    continue
                start(task, args)
            if len(nodes) == len(tasks):
                break
            if not progressed:
                if failures:
                    raise failures[0]
                if not running:
                    raise EngineStuck(f"DAG {name}: no task can start and none is running")
                changed.wait()
    dag_node.phase = _assess(tmpl, tasks, deps, nodes)
    dag_node.finished = ctl.clock.now()
    if dag_node.failed_or_error:
        dag_node.message = next((n.message for n in nodes.values() if n.failed_or_error and n.message), "")
    return dag_node


def _ancestors(task: str, deps: dict[str, list[str]]) -> list[str]:
    seen: list[str] = []

    def walk(t: str) -> None:
        for d in deps[t]:
            if d not in seen:
                walk(d)
                seen.append(d)
    walk(task)
    return seen


def _task_scope(ctl: Controller, tmpl: Template, task: str, tasks: dict[str, DAGTask],
                deps: dict[str, list[str]], nodes: dict[str, Node]) -> tuple[Scope, dict[str, str]]:
    """(parameters, artifacts): Argo keeps artifacts as structs in the same map, which a simple tag
    cannot substitute into a string; here they are apart."""
    artifacts: dict[str, str] = {}
    with ctl.lock:
        scope: Scope = dict(ctl.globals)
    for p in tmpl.inputs.parameters:
        scope[f"inputs.parameters.{p.name}"] = p.value
    for a in _ancestors(task, deps):
        node, prefix = nodes[a], f"tasks.{a}"
        scope[f"{prefix}.status"] = node.phase
        if node.has_outputs:
            if node.exit_code is not None:
                scope[f"{prefix}.exitCode"] = node.exit_code
            for k, v in node.params.items():
                scope[f"{prefix}.outputs.parameters.{k}"] = v
            for k, path in node.artifacts.items():
                artifacts[f"{prefix}.outputs.artifacts.{k}"] = str(path)
        elif node.phase in ("Skipped", "Omitted"):
            for p in ctl.spec.template(tasks[a].template).outputs.parameters:
                scope[f"{prefix}.outputs.parameters.{p.name}"] = p.valueFrom.default if p.valueFrom else None
    return scope, artifacts


def _resolve_args(task: DAGTask, scope: Scope, artifacts_in: dict[str, str], absent: str) -> Arguments:
    data = task.arguments.model_dump(by_alias=True, exclude_none=True)
    for p in data.get("parameters", []):  # scope.go markAbsentOptionalArgs
        v = p.get("value", "")
        if v.startswith("{{") and v.endswith("}}") and v[2:-2].strip() in scope and scope[v[2:-2].strip()] is None:
            p["value"] = absent
    data = replace(data, scope, strict=("tasks", "steps"))
    artifacts = []
    for a in data.get("artifacts", []):
        ref = a.pop("from", None)
        if ref is None:
            artifacts.append(Artifact.model_validate(a))
            continue
        key = ref.strip()[2:-2].strip() if ref.strip().startswith("{{") else ref
        if key not in artifacts_in:
            if a.get("optional"):
                continue
            raise ValueError(f"Unable to resolve: {ref}")
        artifacts.append(Artifact(name=a["name"], path=artifacts_in[key]))
    return Arguments(parameters=[Parameter.model_validate(p) for p in data.get("parameters", [])], artifacts=artifacts)


def _assess(tmpl: Template, tasks: dict[str, DAGTask], deps: dict[str, list[str]], nodes: dict[str, Node]) -> str:
    """assessDAGPhase: BFS from the root tasks; a task's branch phase is its own when it completed,
    else its parent's; the first time a node is reached decides (uniquePhaseNodeQueue)."""
    children = {t: [c for c in tasks if t in deps[c]] for t in tasks}
    leaves = sorted(t for t in tasks if not children[t])
    queue = [(t, "Succeeded") for t in tasks if not deps[t]]
    seen: set[str] = set()
    target_phase: dict[str, str] = {}
    while queue:
        t, branch = queue.pop(0)
        if t in seen:
            continue
        seen.add(t)
        if nodes[t].completed:
            branch = nodes[t].phase
        if t in leaves and target_phase.get(t) not in ("Failed", "Error"):
            target_phase[t] = branch
        queue += [(c, branch) for c in children[t]]
    for t in leaves:
        if target_phase.get(t) in ("Failed", "Error"):
            return target_phase[t]
    return "Succeeded"
