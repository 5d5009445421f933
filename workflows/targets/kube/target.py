"""The Kubernetes target: a release as a KubeRay RayService per colour, blue/green, state kept in the cluster.

Why blue/green instead of editing one RayService: a change under `rayClusterConfig` makes KubeRay
build a new RayCluster and switch traffic as soon as Serve is healthy, before pdops has validated
anything. So each slot is its own RayService, `<name>-blue` / `<name>-green`, and users reach the
stable one through the manifest's own Service (`pd-llm`, port 8000), which promote points at one
colour (objects.py says what is applied and why). Intent is written to the history ConfigMap
before the cluster is changed, so a run that dies half way leaves a record the next run acts on.
Every write is server-side apply or a delete; with `dry_run` each carries dryRun=All.
"""
from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from kubernetes import client, config

from workflows.names import ROLE_LABEL, run_lease_s
from workflows.spec.release import Timeouts
from workflows.targets.base import Endpoint, Progress, ReleaseRecord, SlotStatus, TargetError, TargetStatus, last_good
from workflows.targets.kube import golden_cache, objects as obj, reference as ref, traffic
from workflows.targets.kube.api import Kube
from workflows.targets.kube.baseline import ROLE as BASELINE_ROLE, Baselines
from workflows.targets.kube.capacity import PodNeed, place, rayservice_pods
from workflows.targets.kube.history import HistoryStore, State
from workflows.targets.kube.lease import LEASE_S, ReleaseLock, run_holder
from workflows.targets.kube.readiness import event_lines, pod_problems, rayservice_state
from workflows.targets.kube.slots import Slots
from workflows.targets.polling import Poll

PROGRESS_EVERY_S = 30.0
RECENT_EVENTS = 10
_DEFAULT = Timeouts()   # release.yaml `timeouts` (workflows/spec/release.py): the one place the waits are set


class KubernetesTarget(Slots, ref.References, Baselines):
    """Blue/green RayServices in one namespace, driven with the official `kubernetes` client."""

    kind = "kubernetes"

    def __init__(self, namespace: str, *, kubeconfig: str | None = None, context: str | None = None,
                 dry_run: bool = False, api_client: client.ApiClient | None = None, poll_s: float = 5.0,
                 restore_timeout_s: float = _DEFAULT.restore_s, capacity_check: bool = True, lease_s: float = LEASE_S,
                 drain_grace_s: float = _DEFAULT.drain_s, metrics_lag_s: float | None = None,
                 reference_timeout_s: float = _DEFAULT.reference_s, budget_s: float | None = None,
                 run_id: str | None = None) -> None:
        """`api_client` replaces kubeconfig loading (tests point it at an emulator). `restore_timeout_s`
        bounds the waits rollback itself does and the drain on promote. `capacity_check=False` is for
        node groups that an autoscaler grows on demand. `reference_timeout_s` bounds the wait for the
        single-engine reference RayService (reference.py). `budget_s`: every wait of this process
        (readiness, a RayService terminating, the drain) ends within it: an Argo step's share of the
        release's `timeouts` (release_cli.open_target), which its activeDeadlineSeconds contains.
        `metrics_lag_s`: how stale the engines' metrics can be; None: what each release's render sets
        (traffic.export_lag_s)."""
        self._ends = None if budget_s is None else time.monotonic() + budget_s
        self.run_id = run_id   # an Argo run's id: session() holds that run's Lease (RUN_ENV)
        self._capacity_forbidden = False   # _room could not list nodes: placement is unknown
        self.namespace, self.dry_run, self.poll_s = namespace, dry_run, poll_s
        self.restore_timeout_s, self.capacity_check, self.lease_s = restore_timeout_s, capacity_check, lease_s
        self.drain_grace_s, self.metrics_lag_s = drain_grace_s, metrics_lag_s
        self.reference_timeout_s = reference_timeout_s
        self._reference_skips: dict[str, str] = {}   # digest -> why the reference could not run (asked once)
        self.api = api_client or _load_client(kubeconfig, context)
        self.kube = Kube(self.api, namespace, dry_run)
        self.store = HistoryStore(self.kube)
        self._release: str | None = None
        self._lock: ReleaseLock | None = None
        self._dry_candidate: ReleaseRecord | None = None  # dry runs store nothing; remembered for wait/promote

    # ---- the Target protocol ----

    @contextmanager
    def session(self) -> Iterator[None]:
        """Hold the Lease `pdops-release` (lease.py) for the whole release; dry runs store nothing and take no lock.
        A step of an Argo run ($PDOPS_RUN_ID) holds the run's Lease instead, taken by its first step
        (`pdops run start`): it renews it while it runs and fails, naming the holder, when the run does
        not hold it; the Lease stays held after it (the exit handler's `pdops run end` releases it)."""
        if self.dry_run:
            yield
            return
        if self.run_id:
            lock = ReleaseLock(self.kube, run_holder(self.run_id), run_lease_s(), min(self.poll_s, 1.0))
            lock.hold()
            done = lock.detach
        else:
            holder = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
            lock = ReleaseLock(self.kube, holder, self.lease_s, min(self.poll_s, 1.0))
            # session() has no progress; a takeover waits minutes
            lock.acquire(lambda line: print(line, file=sys.stderr, flush=True))
            done = lock.release
        self._lock = lock
        try:
            yield
        finally:
            self._lock = None
            done()

    def reference(self, record: ReleaseRecord, prompts: list[str], max_tokens: int,
                  progress: Progress) -> list[dict] | None:
        """Golden answers of the reference RayService (reference.py), cached in the release's own record
        in the history (ReleaseRecord.golden; golden_cache.py) by engine, prompts and max_tokens: the
        reference starts only when the release has none for them. None when it could not run (the reason
        is progress-printed and remembered: validation then reports golden tokens skipped with it)."""
        from validation import golden

        key = golden_cache.key(ref.engine_identity(ref.rayservice(record, self.namespace)), prompts, max_tokens)
        if not self.dry_run:
            self._check_lock()
            legacy = golden_cache.retire_legacy(self.kube, self.store, record, key)
            if legacy:
                progress(f"[golden] {legacy}")
        cached = golden_cache.find(self._state(record.name), record.digest, key)
        if cached is not None:
            progress(f"[golden] reference answers cached in the release record of {record.short()} "
                     f"({key[:12]}): no reference RayService needed")
            return cached
        with self.reference_server(record, progress) as url:
            if not isinstance(url, str):
                return None
            answers = golden.collect(url, record.model, prompts, max_tokens)
        if any(a.get("error") for a in answers):   # a failed request is kept for the gate, never cached
            progress("[golden] a reference request failed: answers not cached")
            return answers
        if not self.dry_run:
            self._check_lock()
            progress(f"[golden] reference answers {golden_cache.save(self.store, record, key, answers)}")
        return answers

    def status(self) -> TargetStatus:
        state = self._state()
        stable = self._slot_status("stable", state.stable)
        if state.stable and stable.state != "absent":
            selected = self._service_colour(state.stable)
            if selected != state.stable.colour:  # a run died between recording a promote and switching
                stable.state = "failed"
                stable.detail += (f"; but Service {obj.service_name(state.stable)} selects {selected or 'nothing'}"
                                  " — `pdops rollback` points it at the stable slot")
        leftovers = [f"RayService {rs['metadata']['name']} (single-engine reference of a run that did not finish; "
                     "the next release or `pdops rollback` deletes it)"
                     for rs in self.kube.list("RayService", {ROLE_LABEL: ref.ROLE})]
        leftovers += [f"RayService {rs['metadata']['name']} (vs_stable baseline of a run that did not finish; "
                      "the next release or `pdops rollback` deletes it)"
                      for rs in self.kube.list("RayService", {ROLE_LABEL: BASELINE_ROLE})]
        return TargetStatus(target=self.kind, stable=stable, candidate=self._slot_status("candidate", state.candidate),
                            last_good=last_good(state.history), leftovers=leftovers)

    def wait_ready(self, timeout_s: float, progress: Progress) -> Endpoint:
        candidate = self._candidate(self._state())
        if self.dry_run and candidate is self._dry_candidate:
            progress(f"[rollout] dry run: {obj.rs_name(candidate)} was not created; not waiting")
        else:
            self._wait(candidate, timeout_s, progress)
        return traffic.endpoint(self.kube, "candidate", candidate, self.metrics_lag_s)

    def endpoint(self, slot: Literal["stable", "candidate"]) -> Endpoint:
        state = self._state()
        record = state.stable if slot == "stable" else (state.candidate or self._dry_candidate)
        if record is None:
            raise TargetError(f"no {slot} release in namespace {self.namespace}",
                              ["run `pdops rollout` (and promote) first"])
        return traffic.endpoint(self.kube, slot, record, self.metrics_lag_s)

    def history(self) -> list[ReleaseRecord]:
        return self._state().history

    def canary_history(self) -> dict[str, Any] | None:
        """The canary's run history of the serving release, kept in the release history ConfigMap."""
        return self._state().canary

    def update_canary_history(self, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Read-modify-write of canary.json, holding the run's Lease: `change` gets the history as
        stored and returns the new one (equal: nothing is written). The write carries the
        resourceVersion read (HistoryStore.update); on 409 the ConfigMap is read again and `change`
        called again on what the other writer stored, so its entry is kept. Returns the history of
        the attempt that was stored (or found unchanged)."""
        self._check_lock()
        release = self._release or self.store.find_release()
        if release is None:
            raise TargetError("no release history in this namespace: nothing for the canary to record",
                              ["promote a release first"])
        attempts: list[dict[str, Any]] = []

        def apply(state: State) -> bool:
            new = change(state.canary)
            attempts.append(new)
            if new == state.canary:
                return False
            state.canary = new
            return True
        self.store.update(release, apply)
        if not attempts:   # HistoryStore.update found no ConfigMap: deleted since find_release
            raise TargetError(f"the release history ConfigMap {self.store.name(release)} is gone: nothing for "
                              "the canary to record", ["promote a release first"])
        return attempts[-1]

    # ---- state ----

    def _state(self, release: str | None = None) -> State:
        release = release or self._release or self.store.find_release()
        if release is None:
            return State()
        self._release = release
        return self.store.read(release)

    def _save(self, state: State) -> None:
        self._check_lock()
        state.release = state.release or self._release
        self.store.save(state)

    def _check_lock(self) -> None:
        if self._lock is not None:
            self._lock.check()

    def _candidate(self, state: State) -> ReleaseRecord:
        candidate = state.candidate or self._dry_candidate
        if candidate is None:
            raise TargetError(f"no candidate is pending in namespace {self.namespace}", ["run `pdops rollout` first"])
        return candidate

    def _slot_status(self, slot: Literal["stable", "candidate"], record: ReleaseRecord | None) -> SlotStatus:
        if record is None:
            return SlotStatus(slot=slot)
        rs = self.kube.get("RayService", obj.rs_name(record))
        if rs is None:
            return SlotStatus(slot=slot, release=record, state="absent",
                              detail=f"RayService {obj.rs_name(record)} not found")
        found = rayservice_state(rs)
        return SlotStatus(slot=slot, release=record, state=found.state, detail=f"{obj.rs_name(record)}: {found.detail}",
                          endpoint=traffic.endpoint(self.kube, slot, record, self.metrics_lag_s))

    # ---- readiness ----

    def _bound(self, timeout_s: float) -> float:
        """`timeout_s`, cut to what is left of this process's budget."""
        return timeout_s if self._ends is None else max(0.0, min(timeout_s, self._ends - time.monotonic()))

    def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress) -> None:
        name, start, last, last_at = obj.rs_name(record), time.monotonic(), "", 0.0
        timeout_s, poll = self._bound(timeout_s), Poll(self.poll_s)
        while True:
            elapsed = time.monotonic() - start
            rs = self.kube.get("RayService", name)
            if rs is None:
                raise TargetError(f"RayService {name} does not exist (deleted while waiting?)", self._diagnosis(record))
            found = rayservice_state(rs)
            if found.state == "ready":
                progress(f"[rollout] {name}: RUNNING ({elapsed:.0f}s)")
                return
            if found.detail != last or elapsed - last_at >= PROGRESS_EVERY_S:
                progress(f"[rollout] {name}: {found.detail} ({elapsed:.0f}s)")
                last, last_at = found.detail, elapsed
            if found.terminal:
                raise TargetError(f"{name} failed to deploy: {found.detail}", self._diagnosis(record))
            if elapsed >= timeout_s:
                raise TargetError(f"{name} not ready after {timeout_s:.0f}s: {found.detail}", self._diagnosis(record))
            poll.sleep()

    def _diagnosis(self, record: ReleaseRecord) -> list[str]:
        """Failing pods of the colour and recent namespace Events about its objects, newest last."""
        name = obj.rs_name(record)
        out = [line for pod in self.kube.list("Pod", {obj.COLOUR_LABEL: record.colour}) for line in pod_problems(pod)]
        out += event_lines(self.kube.list("Event"), name, RECENT_EVENTS)
        return out or [f"no failing pods or events found for {name}; "
                       f"`kubectl -n {self.namespace} describe rayservice {name}`"]

    def _wait_gone(self, name: str, progress: Progress, step: str = "rollout") -> None:
        """KubeRay's finalizer keeps a deleted RayService until its RayClusters are gone; applying
        over it in that time would be lost with it."""
        start, said, limit, poll = time.monotonic(), False, self._bound(self.restore_timeout_s), Poll(self.poll_s)
        while not self.dry_run and (rs := self.kube.get("RayService", name)) is not None:
            if not rs["metadata"].get("deletionTimestamp"):
                return
            if not said:
                progress(f"[{step}] waiting for RayService {name} to finish terminating (finalizers: "
                         f"{', '.join(rs['metadata'].get('finalizers') or []) or 'none'})")
                said = True
            if time.monotonic() - start >= limit:
                raise TargetError(f"RayService {name} is still terminating after {limit:.0f}s",
                                  [f"`kubectl -n {self.namespace} get rayservice {name} -o yaml` shows its finalizers"])
            poll.sleep()
        if said:
            progress(f"[{step}] {name} is gone ({time.monotonic() - start:.1f}s)")

    # ---- capacity ----

    def _room(self, rayservice: dict, progress: Progress, step: str = "capacity") -> list[str]:
        """What of the RayService's pods fits on no node beside what is bound there (capacity.py);
        [] when all fit or the check is disabled or forbidden (each said in a progress line)."""
        if not self.capacity_check:
            progress(f"[{step}] check disabled (capacity_check=False)")
            return []
        wanted: list[PodNeed] = rayservice_pods(rayservice)
        try:
            nodes, pods = self.kube.list("Node"), self.kube.list("Pod", all_namespaces=True)
        except TargetError as exc:
            if getattr(exc, "status", None) != 403:
                raise
            progress(f"[{step}] capacity check skipped: listing nodes and pods cluster-wide is forbidden (the "
                     "pd-release Role is namespaced). Bind the ClusterRole `pdops-node-reader` "
                     "(docs/kubernetes.md#install-on-eks, step 7) to enable the check")
            self._capacity_forbidden = True
            return []
        placed, short = place(wanted, nodes, pods)
        for line in placed:
            progress(f"[{step}] {line}")
        return short

    def _unplaceable(self, role: str) -> str | None:
        """Without the node-reader ClusterRole nothing checked that the `role` pods fit: one the scheduler
        calls Unschedulable will not start (no autoscaler is assumed: capacity_check is on), so say so now,
        with the fix, instead of waiting the whole reference timeout."""
        if not self._capacity_forbidden:
            return None
        for pod in self.kube.list("Pod", {ROLE_LABEL: role}):
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                    return (f"pod {pod['metadata']['name']} is Unschedulable ({cond.get('message', '')}) and its "
                            "room could not be checked: bind the ClusterRole `pdops-node-reader` "
                            "(docs/kubernetes.md#install-on-eks, step 7) so pdops checks room before it starts, "
                            "or free a node for it")
        return None

    def _check_capacity(self, candidate: ReleaseRecord, progress: Progress) -> None:
        """Every pod of the candidate must fit on some node next to what is already there (capacity.py):
        KubeRay leaves a RayCluster that does not fit Pending, and the rollout hangs until the timeout."""
        short = self._room(obj.only(candidate, "RayService"), progress)
        if short:
            raise TargetError(f"the candidate {obj.rs_name(candidate)} does not fit on the cluster's nodes", short + [
                "blue/green runs a new RayCluster beside the stable one until promotion, so its pods need room next to "
                "everything already on the nodes; without it KubeRay leaves them Pending and the rollout hangs",
                "fix: add nodes to the node group(s) named above (eksctl scale nodegroup, or raise the Karpenter "
                "NodePool limits), or free them, then re-run; if an autoscaler adds nodes on demand, disable the check "
                "(capacity_check=False)"])


def _load_client(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """In a pod (the Argo step) the ServiceAccount's token; elsewhere the kubeconfig and context."""
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError) as exc:
        raise TargetError(f"cannot load Kubernetes credentials: {exc}",
                          ["pass --kubeconfig FILE (and --context NAME), "
                           "or run in the cluster as the pd-release ServiceAccount"]) from None
