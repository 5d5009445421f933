"""One Workflow from submission to its metrics (workflow/controller/operator.go `operate`, v4.0.10).

submit -> ValidateWorkflow (validate.py) -> workflow mutex (spec.synchronization, acquired before
anything runs, released when the workflow is done: sync manager TryAcquire/Release; held in the
memory of one controller, see `_mutex`) -> global
parameters (setGlobalParameters; workflow.status is the phase while running) -> the entrypoint
node -> workflow.status = the entry node's phase mapped to a workflow phase, workflow.failures ->
the onExit node (its pods ignore the workflow deadline) -> the workflow's phase (a failed exit
handler fails a succeeded workflow) -> custom metrics (computeMetrics, below).

`deleted_when`: the Workflow is deleted once it holds (`kubectl delete workflow`): its pods are
garbage-collected (SIGKILLed here), nothing more runs, not even the exit handler; the run's phase is
then "Deleted" (no Argo phase: the object is gone).
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.argo.engine import Controller
from tests.argo.exprs import ExprError, eval_when
from tests.argo.nodes import Clock, Node
from tests.argo.pod import PodRunner
from tests.argo.spec import Arguments, WorkflowSpec
from tests.argo.substitute import Unresolved, replace
from tests.argo.validate import validate_submission

_MUTEXES: dict[str, threading.Lock] = {}
_MUTEXES_LOCK = threading.Lock()
PHASE = {"Pending": "Pending", "Running": "Running", "Succeeded": "Succeeded", "Skipped": "Succeeded",
         "Failed": "Failed", "Error": "Error", "Omitted": "Succeeded"}


@dataclass
class Series:
    name: str
    kind: str
    labels: dict[str, str]
    value: float


@dataclass
class Run:
    name: str
    phase: str
    message: str
    entry: Node
    exit: Node | None
    nodes: dict[str, Node]
    outputs: dict[str, str]               # workflow.outputs.parameters
    metrics: list[Series] = field(default_factory=list)
    metric_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    mutex: str | None = None
    backoff_waits: list[float] = field(default_factory=list)

    def task(self, name: str, on_exit: bool = False) -> Node:
        """The node of a DAG task of the entrypoint (or of the exit handler)."""
        prefix = f"{self.name}.onExit." if on_exit else f"{self.name}."
        return self.nodes[prefix + name]

    def phases(self, on_exit: bool = False) -> dict[str, str]:
        prefix = f"{self.name}.onExit." if on_exit else f"{self.name}."
        return {k[len(prefix):]: n.phase for k, n in self.nodes.items()
                if k.startswith(prefix) and "(" not in k and (on_exit or ".onExit" not in k)}

    def series(self, name: str) -> list[Series]:
        return [s for s in self.metrics if s.name == name]

    def describe(self) -> str:
        lines = [f"{self.name}: {self.phase} {self.message}"]
        for k, n in self.nodes.items():
            lines.append(f"  {k}: {n.phase} {n.message} ({n.finished - n.started:.0f} s)")
            if n.failed_or_error and n.log:
                lines += [f"      | {line}" for line in n.log.strip().splitlines()[-12:]]
        lines.append(f"  outputs: {self.outputs}")
        lines.append(f"  metrics: {[(m.name, m.labels, m.value) for m in self.metrics]} errors: {self.metric_errors}")
        return "\n".join(lines)


def run_workflow(spec: WorkflowSpec, runner: PodRunner, *, work: Path, parameters: dict[str, str] | None = None,
                 via: str = "cli", generate_name: str = "wf-", namespace: str = "pdops",
                 repos: dict[str, Path] | None = None, secrets: dict[str, dict[str, str]] | None = None,
                 kill_after: dict[str, float | Callable[[], bool]] | None = None, controller: str = "controller",
                 pod_env: dict[str, str] | None = None, deleted_when: Callable[[], bool] | None = None,
                 name: str | None = None) -> Run:
    """`controller`: which workflow controller runs it (its mutexes are its own: `_mutex`); `pod_env`:
    added to every pod's environment (Controller); `name`: instead of generate_name + a random suffix."""
    merged = validate_submission(spec, parameters or {}, via)
    name = name or generate_name + uuid.uuid4().hex[:5]
    clock = Clock()
    work = work / name
    ctl = Controller(spec, name, runner, clock=clock, work=work, repos=repos or {}, secrets=secrets or {},
                     kill_after=kill_after, pod_env=pod_env)
    ctl.globals.update({"workflow.name": name, "workflow.namespace": namespace, "workflow.uid": str(uuid.uuid4()),
                        "workflow.mainEntrypoint": spec.entrypoint or "", "workflow.status": "Running",
                        "workflow.serviceAccountName": spec.serviceAccountName or "",
                        "workflow.parameters": json.dumps([p.model_dump(exclude_none=True) for p in merged])})
    ctl.globals.update({f"workflow.parameters.{p.name}": p.value for p in merged})
    mutex = None
    if spec.synchronization is not None:
        (m,) = spec.synchronization.mutexes
        mutex = replace(m.name, ctl.globals)
    lock = _mutex(controller, f"{namespace}/{mutex}") if mutex else None
    started = time.monotonic()
    if lock:
        lock.acquire()
    ended = threading.Event()
    if deleted_when is not None:
        threading.Thread(target=_delete_when, args=(deleted_when, ctl.deleted, ended), daemon=True).start()
    try:
        if spec.activeDeadlineSeconds is not None:
            ctl.wf_deadline = clock.now() + spec.activeDeadlineSeconds
        entry = ctl.execute(name, spec.entrypoint, Arguments(), on_exit=False)
        if ctl.deleted.is_set():   # the controller forgets it: no exit handler, no metrics
            run = Run(name, "Deleted", "the Workflow was deleted", entry, None, dict(ctl.nodes), {}, mutex=mutex)
            run.seconds = time.monotonic() - started
            return run
        status = PHASE[entry.phase]
        ctl.globals["workflow.status"] = status
        ctl.globals["workflow.failures"] = json.dumps([
            {"displayName": n.name.rsplit(".", 1)[-1], "message": n.message, "templateName": n.template,
             "phase": n.phase} for n in ctl.nodes.values() if n.failed_or_error])
        exit_node = ctl.execute(f"{name}.onExit", spec.onExit, Arguments(), on_exit=True) if spec.onExit else None
        phase, message = status, entry.message
        if status == "Succeeded" and exit_node is not None and exit_node.failed_or_error:
            phase, message = exit_node.phase, exit_node.message
        outputs = {k.removeprefix("workflow.outputs.parameters."): v for k, v in ctl.globals.items()
                   if k.startswith("workflow.outputs.parameters.")}
        run = Run(name, phase, message, entry, exit_node, dict(ctl.nodes), outputs, mutex=mutex,
                  backoff_waits=list(clock.waits))
        if spec.metrics is not None:
            ctl.globals["workflow.status"] = status  # operate(): the entry node's phase, not the exit handler's
            scope = {**ctl.globals, "status": entry.phase, "duration": f"{entry.finished - entry.started:f}"}
            run.metrics, run.metric_errors = compute_metrics(spec, scope)
    finally:
        ended.set()
        if lock:
            lock.release()
    run.seconds = time.monotonic() - started
    return run


def _delete_when(condition: Callable[[], bool], deleted: threading.Event, ended: threading.Event) -> None:
    while not ended.is_set():
        if condition():
            deleted.set()
            return
        time.sleep(0.05)


def _mutex(controller: str, key: str) -> threading.Lock:
    """A mutex of one controller. Argo keeps a `mutexes` lock in the memory of the controller that runs
    the workflow (workflow/sync/sync_manager.go Manager.initializeMutex: a lockKindMutex name is a
    newInternalMutex, mutex.go: a size-1 golang.org/x/sync/semaphore in the Manager's syncLockMap);
    only a mutex with `database: true` (lock_name.go getMutexLockName -> lockKindDatabase) is shared by
    controllers, and pd-release's is not. So two controllers (two clusters' Argo, or a second
    installation watching the namespace) run two pd-release of one environment at once."""
    with _MUTEXES_LOCK:
        return _MUTEXES.setdefault(f"{controller}/{key}", threading.Lock())


_METRIC_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # metrics/util.go IsValidMetricName (no ':')


def compute_metrics(spec: WorkflowSpec, scope: dict[str, str]) -> tuple[list[Series], list[str]]:
    """operator.go computeMetrics for realtime=false metrics at the end: labels/name/help/when
    substituted with unresolved tags forbidden, then the value; any error is a MetricsError condition
    and the metric is not emitted. metrics_custom.go UpsertCustomMetric: the value must parse as a
    float; a counter adds it."""
    out, errors = [], []
    for m in spec.metrics.prometheus:
        if m.gauge is not None and m.gauge.realtime:
            raise NotImplementedError("realtime metrics are not emulated")
        try:
            meta = replace(m.model_dump(exclude={"gauge", "counter"}, exclude_none=True), scope, allow_unresolved=False)
            if meta.get("when") and not eval_when(meta["when"]):
                continue
            kind, raw = ("gauge", m.gauge.value) if m.gauge is not None else ("counter", m.counter.value)
            value = replace(raw, scope, allow_unresolved=False)
            if not _METRIC_NAME.match(meta["name"]):
                raise ValueError("metric name is invalid: names may only contain alphanumeric characters or '_'")
            number = float(value)
        except (Unresolved, ExprError, ValueError) as exc:
            errors.append(f"{m.name}: {exc}")
            continue
        out.append(Series(meta["name"], kind, {lb["key"]: lb["value"] for lb in meta.get("labels", [])}, number))
    return out, errors
