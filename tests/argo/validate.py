"""What Argo checks when a Workflow is submitted (workflow/validate/validate.go ValidateWorkflow,
v4.0.10), for the features the tier emulates. A failure is `Rejected`: the API answers 400 and
nothing runs.

Enum: validateArgumentsValues checks each argument's value against its `enum`, over
util.MergeParameters(submitted, template's), where a submitted parameter (name and value only, from
`argo submit -p` via ApplySubmitOpts/overrideParameters, or a Workflow's spec.arguments) wins and
carries no enum: so the API does NOT reject `-p environment=qa`; only the UI offers the enum values
alone (ui/src/shared/components/parameters-input.tsx). `Submission(via="ui")` applies that.
"""
from __future__ import annotations

from tests.argo.exprs import depends_tasks
from tests.argo.spec import Parameter, WorkflowSpec
from tests.argo.substitute import tags

GLOBAL_PREFIXES = ("workflow.name", "workflow.namespace", "workflow.uid", "workflow.serviceAccountName",
                   "workflow.mainEntrypoint", "workflow.creationTimestamp", "workflow.status",
                   "workflow.failures", "workflow.duration", "workflow.parameters")
# workflow/common/common.go GlobalVarValidWorkflowVariablePrefix: only these roots are checked
CHECKED_ROOTS = ("item", "steps.", "inputs.", "outputs.", "pod.", "workflow.", "tasks.")


class Rejected(Exception):
    """The Argo API refused the submission (ValidateWorkflow)."""


def merge_parameters(submitted: dict[str, str], spec: WorkflowSpec) -> list[Parameter]:
    """util.MergeParameters(submitted, template): first wins, by name."""
    merged = [Parameter(name=k, value=v) for k, v in submitted.items()]
    merged += [p for p in spec.arguments.parameters if p.name not in submitted]
    return merged


def validate_submission(spec: WorkflowSpec, submitted: dict[str, str], via: str) -> list[Parameter]:
    known = {p.name for p in spec.arguments.parameters}
    if via == "ui":
        for p in spec.arguments.parameters:
            if p.name in submitted and p.enum is not None and submitted[p.name] not in p.enum:
                raise Rejected(f"the UI offers only {p.enum} for {p.name}")
    merged = merge_parameters(submitted, spec)
    for p in merged:  # validateArgumentsValues
        if p.value is None and p.valueFrom is None:
            raise Rejected(f"spec.arguments.{p.name}.value or spec.arguments.{p.name}.valueFrom is required")
        if p.enum is not None and p.value not in p.enum:
            raise Rejected(f"spec.arguments.{p.name}.value should be present in spec.arguments.{p.name}.enum list")
    unknown = set(submitted) - known
    if unknown:  # not an Argo error: an unused parameter is accepted; flagged because it is a test bug
        raise Rejected(f"parameters {sorted(unknown)} are not declared by the template")
    validate_spec(spec)
    return merged


def validate_spec(spec: WorkflowSpec) -> None:
    names = {t.name for t in spec.templates}
    for ref, what in ((spec.entrypoint, "spec.entrypoint"), (spec.onExit, "spec.onExit")):
        if ref is not None and ref not in names:
            raise Rejected(f"{what} template '{ref}' not found")
    params = {f"workflow.parameters.{p.name}" for p in spec.arguments.parameters}
    volumes = {v.name for v in spec.volumes}
    for t in spec.templates:
        if t.dag is not None:
            if t.activeDeadlineSeconds is not None:  # validateNonLeaf
                raise Rejected(f"templates.{t.name}.activeDeadlineSeconds is only valid for leaf templates")
            _validate_dag(spec, t, names, params)
            continue
        scope = params | {f"inputs.parameters.{p.name}" for p in t.inputs.parameters}
        scope |= {f"inputs.artifacts.{a.name}" for a in t.inputs.artifacts} | {"retries"}
        for tag in tags(t.model_dump(by_alias=True, exclude_none=True)):  # validateLeaf/resolveAllVariables
            if _checked(tag) and tag not in scope and not tag.startswith(("outputs.", "lastRetry.")) \
                    and not (tag.startswith(GLOBAL_PREFIXES) and not tag.startswith("workflow.parameters")):
                raise Rejected(f"templates.{t.name}: failed to resolve {{{{{tag}}}}}")
        for vm in (t.container.volumeMounts if t.container else []):
            if vm.name not in volumes:
                raise Rejected(f"templates.{t.name}: volume '{vm.name}' not found in spec.volumes")


def _checked(tag: str) -> bool:
    return tag.startswith(CHECKED_ROOTS)


def _validate_dag(spec: WorkflowSpec, t, names: set[str], params: set[str]) -> None:
    tasks = {task.name: task for task in t.dag.tasks}
    deps = {}
    for task in t.dag.tasks:
        if task.template not in names:
            raise Rejected(f"templates.{t.name}.tasks.{task.name} template '{task.template}' not found")
        deps[task.name] = depends_tasks(task.depends) if task.depends else []
        for d in deps[task.name]:
            if d not in tasks:
                raise Rejected(f"templates.{t.name}.tasks.{task.name} dependency '{d}' not defined")
    _no_cycles(t.name, deps)
    outputs = {f"tasks.{n}.outputs.parameters.{p.name}" for n, task in tasks.items()
               for p in spec.template(task.template).outputs.parameters}
    outputs |= {f"tasks.{n}.outputs.artifacts.{a.name}" for n, task in tasks.items()
                for a in spec.template(task.template).outputs.artifacts}
    outputs |= {f"tasks.{n}.status" for n in tasks} | {f"tasks.{n}.exitCode" for n in tasks}
    scope = params | outputs | {f"inputs.parameters.{p.name}" for p in t.inputs.parameters}
    for task in t.dag.tasks:
        for tag in tags(task.model_dump(by_alias=True, exclude_none=True)):
            if _checked(tag) and tag not in scope and not (tag.startswith(GLOBAL_PREFIXES)
                                                           and not tag.startswith("workflow.parameters")):
                raise Rejected(f"templates.{t.name}.tasks.{task.name} failed to resolve {{{{{tag}}}}}")
        ancestry = _ancestry(task.name, deps)  # validateDAGTaskArgumentDependency
        refs = [(p.name, p.value or "") for p in task.arguments.parameters] + \
               [(a.name, a.from_ or "") for a in task.arguments.artifacts]
        for arg, value in refs:
            if value.startswith("{{tasks.") and value.split(".")[1] not in ancestry:
                raise Rejected(f"templates.{t.name}.tasks.{task.name} missing dependency "
                               f"'{value.split('.')[1]}' for '{arg}'")


def _ancestry(task: str, deps: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    stack = list(deps[task])
    while stack:
        d = stack.pop()
        if d not in out:
            out.add(d)
            stack += deps[d]
    return out


def _no_cycles(name: str, deps: dict[str, list[str]]) -> None:
    for task in deps:
        if task in _ancestry(task, deps):
            raise Rejected(f"templates.{name} dependency cycle detected at {task}")
