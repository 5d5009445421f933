"""Templates, retries and DAGs executed with the semantics of Argo Workflows v4.0.10's controller.

Each rule cites the upstream function it follows (workflow/controller/*.go, workflow/common/*.go).
One call of `execute` is one node: Argo reconciles the same decisions over many passes of
`operate()`; here they are taken in order, in one pass, with threads for DAG tasks that run at the
same time (compat and bench).
"""
from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.argo.exprs import ExprError, NotEmulated, eval_expr
from tests.argo.nodes import Clock, Node, parse_duration
from tests.argo.pod import PodRunner, PodSpec, Security, cpu_cores, memory_bytes
from tests.argo.spec import Arguments, Artifact, Template, WorkflowSpec
from tests.argo.substitute import AbsentOptional, Scope, Unresolved, replace

ABSENT = "__argo_absent_optional__"  # common.AbsentOptionalArgumentValue's role (scope.go markAbsentOptionalArgs)


class EngineStuck(Exception):
    """Argo would requeue this node forever (a variable that never resolves): the workflow hangs."""


def _kill_when(condition: Callable[[], bool], kill: threading.Event) -> None:
    while not kill.is_set() and not condition():
        time.sleep(0.05)
    kill.set()


class NodeError(Exception):
    """Ends a node in phase Error with this message (markNodeError)."""


class Controller:
    def __init__(self, spec: WorkflowSpec, wf_name: str, runner: PodRunner, *, clock: Clock, work: Path,
                 repos: dict[str, Path], secrets: dict[str, dict[str, str]],
                 kill_after: dict[str, float | Callable[[], bool]] | None = None,
                 on_node: Callable[[Node], None] | None = None, pod_env: dict[str, str] | None = None) -> None:
        """`pod_env`: added to every pod's environment before the template's own (a test's time scale)."""
        self.spec, self.wf_name, self.runner, self.clock, self.work = spec, wf_name, runner, clock, work
        self.repos, self.secrets, self.kill_after = repos, secrets, kill_after or {}
        self.on_node, self.pod_env = on_node, pod_env or {}
        # The Workflow object was deleted (`kubectl delete workflow`, `argo delete`): its pods, owned by
        # it, are garbage-collected and nothing more is scheduled, the exit handler included.
        self.deleted = threading.Event()
        self.globals: dict[str, str] = {}
        self.nodes: dict[str, Node] = {}
        self.wf_deadline: float | None = None
        self.lock = threading.RLock()
        self._checkouts: dict[tuple[str, str], Path] = {}

    # ---- one node of any template ----------------------------------------------------------------

    def execute(self, name: str, template: str, args: Arguments, *, on_exit: bool, task: str = "") -> Node:
        """operator.go executeTemplate: ProcessArgs, then a retry node or the template itself."""
        try:
            tmpl = self._process_args(self.spec.template(template), args, {"node.name": name, "tasks.name": task})
        except (NodeError, Unresolved, AbsentOptional) as exc:
            return self._record(Node(name, template, "Error", str(exc), self.clock.now(), self.clock.now()))
        if tmpl.dag is not None:
            return self._record(self._dag(name, tmpl, on_exit))
        if tmpl.container is None:
            raise NotEmulated(f"templates.{template}: only container and dag templates are emulated")
        if tmpl.retryStrategy is None:
            return self._record(self._pod(name, tmpl, args, on_exit, {}, None, task))
        return self._record(self._retry(name, tmpl, args, on_exit, task))

    def _record(self, node: Node) -> Node:
        with self.lock:
            self.nodes[node.name] = node
        if self.on_node:
            self.on_node(node)
        return node

    def _process_args(self, tmpl: Template, args: Arguments, local: dict[str, str]) -> Template:
        """common.ProcessArgs + SubstituteParams: input defaults, then arguments; globals and locals
        first, then inputs.parameters.*."""
        data = tmpl.model_dump(by_alias=True, exclude_none=True)
        supplied = {p.name: p.value for p in args.parameters}
        for p in data.get("inputs", {}).get("parameters", []):
            value = p.pop("default", None) or p.get("value")  # overwriteWithDefaultParams
            if p["name"] in supplied and supplied[p["name"]] is not None and supplied[p["name"]] != ABSENT:
                value = supplied[p["name"]]
            elif supplied.get(p["name"]) == ABSENT and value is None:
                raise NodeError(f"inputs.parameters.{p['name']}: argument references an absent optional")
            if value is None:
                raise NodeError(f"inputs.parameters.{p['name']} had no value")
            p["value"] = value
        for a in tmpl.inputs.artifacts:
            if not a.optional and a.git is None and args_artifact(args, a.name) is None:
                raise NodeError(f"inputs.artifacts.{a.name} was not supplied")
        scope: Scope = {**self.globals, **local}
        data = replace(data, scope)
        inputs = {f"inputs.parameters.{p['name']}": p["value"] for p in data.get("inputs", {}).get("parameters", [])}
        return Template.model_validate(replace(data, {**scope, **inputs}))

    # ---- retries: operator.go processNodeRetries ---------------------------------------------------------

    def _retry(self, name: str, tmpl: Template, args: Arguments, on_exit: bool, task: str) -> Node:
        rs = tmpl.retryStrategy
        policy = rs.retryPolicy or ("Always" if rs.expression else "OnFailure")  # RetryPolicyActual
        node = Node(name, tmpl.name, "Running", started=self.clock.now())
        exec_deadline: float | None = None
        while True:
            last = node.attempts[-1] if node.attempts else None
            local = {"retries": str(len(node.attempts)), "lastRetry.exitCode": (last.exit_code or "0") if last else "0",
                     "lastRetry.status": last.phase if last else "", "lastRetry.message": last.message if last else "",
                     "lastRetry.duration": f"{last.finished - last.started:g}" if last else "0"}
            attempt = self._pod(f"{name}({len(node.attempts)})", tmpl, args, on_exit, local, exec_deadline, task)
            node.attempts.append(attempt)
            stop, message, exec_deadline = self._retry_decision(node, rs, policy)
            if stop:
                return _finish(node, attempt, message, self.clock.now())

    def _retry_decision(self, node: Node, rs, policy: str) -> tuple[bool, str, float | None]:
        last = node.attempts[-1]
        if not last.failed_or_error:
            return True, "", None
        if self.wf_deadline is not None and self.clock.now() > self.wf_deadline:
            return True, "retry exceeded workflow deadline", None
        max_deadline = None
        if rs.backoff is not None:
            if rs.backoff.maxDuration:
                max_deadline = node.attempts[0].started + parse_duration(rs.backoff.maxDuration)
                if self.clock.now() > max_deadline:
                    return True, "Max duration limit exceeded", None
            wait = parse_duration(rs.backoff.duration)
            if rs.backoff.factor and rs.backoff.factor > 0:
                wait *= rs.backoff.factor ** (len(node.attempts) - 1)
            if rs.backoff.cap:
                wait = min(wait, parse_duration(rs.backoff.cap))
            waiting_deadline = last.finished + wait
            if max_deadline is not None and waiting_deadline > max_deadline:
                return True, "Backoff would exceed max duration limit", None
            if self.clock.now() < waiting_deadline and rs.limit is not None and len(node.attempts) <= rs.limit:
                self.clock.wait(waiting_deadline - self.clock.now())  # requeueAfter(timeToWait)
        on_failed = policy in ("Always", "OnFailure")
        on_error = policy in ("Always", "OnError")
        if (last.phase == "Failed" and not on_failed) or (last.phase == "Error" and not on_error):
            return True, last.message, None
        if rs.limit is not None and len(node.attempts) > rs.limit:
            return True, "No more retries left", None
        if rs.expression:
            env = {"retries": str(len(node.attempts) - 1), "lastRetry": {  # buildRetryStrategyLocalScope
                "exitCode": last.exit_code if last.exit_code is not None else "-1", "status": last.phase,
                "duration": f"{last.finished - last.started:g}", "message": last.message}}
            result = eval_expr(rs.expression, env)
            if not isinstance(result, bool):
                raise ExprError(f"retryStrategy.expression {rs.expression!r} is not a boolean: {result!r}")
            if not result:
                return True, "retryStrategy.expression evaluated to false", None
        return False, "", max_deadline  # opts.executionDeadline = maxDurationDeadline

    # ---- a container: workflowpod.go createWorkflowPod + the executor --------------------------------------

    def _pod(self, name: str, tmpl: Template, args: Arguments, on_exit: bool, local: dict[str, str],
             exec_deadline: float | None, task: str) -> Node:
        if local:
            tmpl = Template.model_validate(replace(tmpl.model_dump(by_alias=True, exclude_none=True), local))
        started = self.clock.now()
        node = Node(name, tmpl.name, "Running", started=started)
        try:
            pod = self._pod_spec(name, tmpl, args, on_exit, exec_deadline)
        except NodeError as exc:
            return _done(node, "Error", str(exc), self.clock.now())
        if pod.deadline_s is not None and pod.deadline_s <= 0:
            return _done(node, "Failed", "Step exceeded its deadline", self.clock.now())
        if self.deleted.is_set():
            return _done(node, "Failed", "pod deleted: the workflow was deleted", self.clock.now())
        kill = threading.Event()
        when = self.kill_after.get(task)
        cond = when if callable(when) else (lambda: False)
        # killed once the cluster shows a state (e.g. the step has started something), or the workflow is deleted
        threading.Thread(target=_kill_when, args=(lambda: self.deleted.is_set() or cond(), kill), daemon=True).start()
        timer = threading.Timer(when, kill.set) if isinstance(when, int | float) else None
        if timer is not None:
            timer.start()
        result = self.runner.run(pod, kill)
        if timer is not None:
            timer.cancel()
        kill.set()   # the pod ended: stop watching
        node = _done(node, result.phase, result.message, self.clock.now())
        node.params, node.artifacts, node.log, node.has_outputs = result.params, result.artifacts, result.log, True
        node.exit_code = str(result.exit_code) if result.exit_code is not None else None
        node.globals = {p.name: p.globalName for p in tmpl.outputs.parameters if p.globalName}
        with self.lock:  # operator.go podReconciliation -> addOutputsToGlobalScope, whatever the phase
            for pname, gname in node.globals.items():
                if pname in node.params:
                    self.globals[f"workflow.outputs.parameters.{gname}"] = node.params[pname]
        return node

    def _pod_spec(self, name: str, tmpl: Template, args: Arguments, on_exit: bool, exec_deadline: float | None) -> PodSpec:
        c = tmpl.container
        volumes = {v.name: v for v in self.spec.volumes}
        mounts: dict[str, Path] = {}
        for vm in c.volumeMounts:
            if vm.name not in volumes:
                raise NodeError(f"volume {vm.name} not found")
            d = self.work / "volumes" / f"{_safe(name)}-{vm.name}"
            d.mkdir(parents=True, exist_ok=False)
            mounts[vm.mountPath] = d  # an emptyDir: new and empty for every pod
        inputs: dict[str, Path] = {}
        for a in tmpl.inputs.artifacts:
            src = self._checkout(a) if a.git is not None else args_artifact(args, a.name)
            if src is None:
                continue
            inputs[a.path] = src
        env: dict[str, str] = dict(self.pod_env)
        for e in c.env:
            if e.valueFrom is None:
                env[e.name] = e.value or ""
                continue
            ref = e.valueFrom.secretKeyRef
            value = self.secrets.get(ref.name, {}).get(ref.key)
            if value is not None:
                env[e.name] = value
            elif not ref.optional:
                raise NotEmulated(f"env {e.name}: secret {ref.name}/{ref.key} missing and not optional "
                                  "(the pod would stay in CreateContainerConfigError)")
        command = (c.command or self.runner.entrypoint) + list(c.args)
        deadline, message = tmpl.activeDeadlineSeconds, "Pod was active on the node longer than the specified deadline"
        now = self.clock.now()
        if self.wf_deadline is not None and not on_exit:  # workflowpod.go: exit handlers ignore it
            remaining = self.wf_deadline - now
            if deadline is None or remaining < deadline:
                deadline = remaining
        if exec_deadline is not None and (deadline is None or exec_deadline - now < deadline):
            deadline, message = exec_deadline - now, "Step exceeded its deadline"  # ARGO_DEADLINE
        return PodSpec(name=name, command=command, env=env, working_dir=c.workingDir, mounts=mounts, inputs=inputs,
                       out_params=[(p.name, p.valueFrom.path, p.valueFrom.default) for p in tmpl.outputs.parameters
                                   if p.valueFrom and p.valueFrom.path],
                       out_artifacts=[(a.name, a.path, bool(a.optional)) for a in tmpl.outputs.artifacts],
                       deadline_s=deadline, deadline_message=message, template=tmpl.name,
                       security=Security.of(self.spec.securityContext, c.securityContext),
                       memory_limit=memory_bytes(((c.resources or {}).get("limits") or {}).get("memory")),
                       cpu_request=cpu_cores(((c.resources or {}).get("requests") or {}).get("cpu")),
                       service_account=f"system:serviceaccount:{self.globals.get('workflow.namespace', '')}:"
                                       f"{self.spec.serviceAccountName}" if self.spec.serviceAccountName else None)

    def _checkout(self, a: Artifact) -> Path:
        """The git input artifact (workflow/artifacts/git): here `git archive REV` of a local repository."""
        repo = self.repos.get(a.git.repo)
        if repo is None:
            raise NodeError(f"failed to clone {a.git.repo}: repository not reachable from the test cluster")
        rev = a.git.revision or "HEAD"
        with self.lock:
            if (a.git.repo, rev) in self._checkouts:
                return self._checkouts[(a.git.repo, rev)]
            sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                                 capture_output=True, text=True)
            if sha.returncode != 0:
                raise NodeError(f"failed to checkout {a.git.repo}@{rev}: revision not found")
            dest = self.work / "checkouts" / sha.stdout.strip()
            if not dest.exists():
                dest.mkdir(parents=True)
                archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha.stdout.strip()], stdout=subprocess.PIPE)
                subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
                archive.wait()
            self._checkouts[(a.git.repo, rev)] = dest
            return dest

    # ---- DAG: dag.go executeDAG / executeDAGTask / assessDAGPhase ---------------------------------------

    def _dag(self, name: str, tmpl: Template, on_exit: bool) -> Node:
        from tests.argo.dag import run_dag

        return run_dag(self, name, tmpl, on_exit)


def args_artifact(args: Arguments, name: str) -> Path | None:
    for a in args.artifacts:
        if a.name == name and a.path is not None:
            return Path(a.path)
    return None


def _done(node: Node, phase: str, message: str, now: float) -> Node:
    node.phase, node.message, node.finished = phase, message, now
    return node


def _finish(node: Node, last: Node, message: str, now: float) -> Node:
    """A fulfilled retry node takes its last child's phase and outputs (processNodeRetries)."""
    node.phase, node.finished = last.phase, now
    node.message = message if last.failed_or_error else ""
    node.params, node.artifacts, node.exit_code = last.params, last.artifacts, last.exit_code
    node.has_outputs, node.log, node.globals = last.has_outputs, last.log, last.globals
    return node


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)

