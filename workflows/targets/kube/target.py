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
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Literal

from kubernetes import client, config

from validation.server_metrics import RAY_METRICS_LAG_S
from workflows.targets.base import Endpoint, Progress, ReleaseRecord, SlotStatus, TargetError, TargetStatus, last_good
from workflows.targets.kube import objects as obj, traffic
from workflows.targets.kube.api import Kube
from workflows.targets.kube.capacity import place, rayservice_pods
from workflows.targets.kube.history import HistoryStore, State
from workflows.targets.kube.lease import LEASE_S, ReleaseLock
from workflows.targets.kube.readiness import event_lines, pod_problems, rayservice_state
from workflows.targets.kube.slots import Slots

PROGRESS_EVERY_S = 30.0
RECENT_EVENTS = 10
DRAIN_GRACE_S = 30.0   # kube-proxy on every node follows an EndpointSlice change within seconds; streams finish


class KubernetesTarget(Slots):
    """Blue/green RayServices in one namespace, driven with the official `kubernetes` client."""

    kind = "kubernetes"

    def __init__(self, namespace: str, *, kubeconfig: str | None = None, context: str | None = None,
                 dry_run: bool = False, api_client: client.ApiClient | None = None, poll_s: float = 5.0,
                 restore_timeout_s: float = 3600.0, capacity_check: bool = True, lease_s: float = LEASE_S,
                 drain_grace_s: float = DRAIN_GRACE_S, metrics_lag_s: float = RAY_METRICS_LAG_S) -> None:
        """`api_client` replaces kubeconfig loading (tests point it at an emulator). `restore_timeout_s`
        bounds the waits rollback itself does and the drain on promote. `capacity_check=False` is for
        node groups that an autoscaler grows on demand."""
        self.namespace, self.dry_run, self.poll_s = namespace, dry_run, poll_s
        self.restore_timeout_s, self.capacity_check, self.lease_s = restore_timeout_s, capacity_check, lease_s
        self.drain_grace_s, self.metrics_lag_s = drain_grace_s, metrics_lag_s
        self.api = api_client or _load_client(kubeconfig, context)
        self.kube = Kube(self.api, namespace, dry_run)
        self.store = HistoryStore(self.kube)
        self._release: str | None = None
        self._lock: ReleaseLock | None = None
        self._dry_candidate: ReleaseRecord | None = None  # dry runs store nothing; remembered for wait/promote

    # ---- the Target protocol ----

    @contextmanager
    def session(self) -> Iterator[None]:
        """Hold the Lease `pdops-release` (lease.py) for the whole release; dry runs store nothing and take no lock."""
        if self.dry_run:
            yield
            return
        holder = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        lock = ReleaseLock(self.kube, holder, self.lease_s, min(self.poll_s, 1.0))
        # session() has no progress; a takeover waits minutes
        lock.acquire(lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = lock
        try:
            yield
        finally:
            self._lock = None
            lock.release()

    def reference(self, record: ReleaseRecord, prompts: list[str], max_tokens: int,
                  progress: Progress) -> list[dict] | None:
        """None: a single-engine reference of a 70B model would be a third GPU deployment; the golden
        token check runs where the local target can run the engine."""
        progress("[validate] golden tokens: no single-engine reference on the kubernetes target; skipped")
        return None

    def reference_server(self, record: ReleaseRecord, progress: Progress) -> AbstractContextManager[str | None]:
        """None (golden tokens and `pdops diff` are skipped): no single-engine reference runs on the
        cluster yet; README "Kubernetes target" has the design (a short-lived reference RayService)."""
        progress("[validate] no single-engine reference on the kubernetes target: golden tokens and diff skipped")
        return nullcontext(None)

    def status(self) -> TargetStatus:
        state = self._state()
        stable = self._slot_status("stable", state.stable)
        if state.stable and stable.state != "absent":
            selected = self._service_colour(state.stable)
            if selected != state.stable.colour:  # a run died between recording a promote and switching
                stable.state = "failed"
                stable.detail += (f"; but Service {obj.service_name(state.stable)} selects {selected or 'nothing'}"
                                  " — `pdops rollback` points it at the stable slot")
        return TargetStatus(target=self.kind, stable=stable, candidate=self._slot_status("candidate", state.candidate),
                            last_good=last_good(state.history))

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

    def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress) -> None:
        name, start, last, last_at = obj.rs_name(record), time.monotonic(), "", 0.0
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
            time.sleep(self.poll_s)

    def _diagnosis(self, record: ReleaseRecord) -> list[str]:
        """Failing pods of the colour and recent namespace Events about its objects, newest last."""
        name = obj.rs_name(record)
        out = [line for pod in self.kube.list("Pod", {obj.COLOUR_LABEL: record.colour}) for line in pod_problems(pod)]
        out += event_lines(self.kube.list("Event"), name, RECENT_EVENTS)
        return out or [f"no failing pods or events found for {name}; "
                       f"`kubectl -n {self.namespace} describe rayservice {name}`"]

    def _wait_gone(self, name: str, progress: Progress) -> None:
        """KubeRay's finalizer keeps a deleted RayService until its RayClusters are gone; applying
        over it in that time would be lost with it."""
        start, said = time.monotonic(), False
        while not self.dry_run and (rs := self.kube.get("RayService", name)) is not None:
            if not rs["metadata"].get("deletionTimestamp"):
                return
            if not said:
                progress(f"[rollout] waiting for RayService {name} to finish terminating (finalizers: "
                         f"{', '.join(rs['metadata'].get('finalizers') or []) or 'none'})")
                said = True
            if time.monotonic() - start >= self.restore_timeout_s:
                raise TargetError(f"RayService {name} is still terminating after {self.restore_timeout_s:.0f}s",
                                  [f"`kubectl -n {self.namespace} get rayservice {name} -o yaml` shows its finalizers"])
            time.sleep(self.poll_s)
        if said:
            progress(f"[rollout] {name} is gone ({time.monotonic() - start:.1f}s)")

    # ---- capacity ----

    def _check_capacity(self, candidate: ReleaseRecord, progress: Progress) -> None:
        """Every pod of the candidate must fit on some node next to what is already there (capacity.py):
        KubeRay leaves a RayCluster that does not fit Pending, and the rollout hangs until the timeout."""
        if not self.capacity_check:
            progress("[capacity] check disabled (capacity_check=False)")
            return
        wanted = rayservice_pods(obj.only(candidate, "RayService"))
        try:
            nodes, pods = self.kube.list("Node"), self.kube.list("Pod", all_namespaces=True)
        except TargetError as exc:
            if getattr(exc, "status", None) != 403:
                raise
            progress("[capacity] skipped: listing nodes and pods cluster-wide is forbidden (the pd-release Role is "
                     "namespaced). Bind the ClusterRole `pdops-node-reader` (README, Install on EKS) to enable "
                     "the check")
            return
        placed, short = place(wanted, nodes, pods)
        for line in placed:
            progress(f"[capacity] {line}")
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
