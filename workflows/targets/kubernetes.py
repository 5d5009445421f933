"""The Kubernetes target: a release as a KubeRay RayService, blue/green, state kept in the cluster.

Why blue/green instead of editing one RayService: any change under `rayClusterConfig` makes KubeRay
build a new RayCluster and switch traffic as soon as Serve is healthy, before pdops has validated
anything. So each slot is its own RayService, `<name>-blue` / `<name>-green`, and users reach the
stable one through the manifest's own `Service` (`pd-llm`, port 8000) whose selector pdops points
at one colour's head pods on promote.

What happens to the manifest's other objects:
- RayService: renamed per colour, labelled `pdops.dev/colour`; the label is added to every pod
  template too, because KubeRay copies template labels onto pods (and puts `ray.io/cluster`, which
  changes with every new RayCluster, plus `ray.io/node-type`/`ray.io/serve`) but not the RayService
  name. The stable Service selects `pdops.dev/colour=<c>`, `ray.io/node-type=head` and
  `ray.io/serve=true`: the same pods KubeRay's own `<name>-serve-svc` would pick.
- PodDisruptionBudgets: one set per colour (renamed, selector narrowed to the colour). Shared PDBs
  would count a candidate's crash-looping pods as disruptions of the stable slot and block node
  drains of healthy stable pods.
- ServiceAccount, PodMonitor: shared, applied as they are (the PodMonitor also carries the colour
  label into every scraped series, so dashboards can tell the slots apart).
- Service: applied only on promote (and by rollback), never at rollout, so a candidate is never
  reachable on the stable name first.

State lives in the ConfigMap `pdops-history-<release>` (records with their manifests, so rollback
needs nothing but the cluster): `history.json` holds decided releases (oldest first) and
`slots.json` the stable and the pending candidate. Intent is written before the cluster is changed,
so a run that dies half way leaves a record the next run can act on (`rollback` removes a pending
candidate, re-points the Service, and removes leftovers).

All writes are server-side apply (field manager `pdops`, force) or deletes; with `dry_run` every
write carries dryRun=All, so the API server validates and admits it and stores nothing.
"""
from __future__ import annotations

import functools
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, NamedTuple

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from validation.server_metrics import RAY_METRICS_LAG_S
from workflows.names import (COLOUR_LABEL, DIGEST_ANNOTATION, FIELD_MANAGER, HISTORY_LABEL, LOCK_NAME,
                             PART_OF, RELEASE_LABEL, REVISION_ANNOTATION)
from workflows.targets.base import (
    Endpoint, Progress, ReleaseRecord, SlotStatus, TargetError, TargetStatus, appended, last_good, other_colour,
)

APPLY_PATCH = "application/apply-patch+yaml"
GPU = "nvidia.com/gpu"
# Labels KubeRay puts on the pods it creates (ray-operator/controllers/ray/utils/constant.go).
NODE_TYPE_LABEL, SERVE_LABEL = "ray.io/node-type", "ray.io/serve"
# Kinds this target reads or writes: core kinds go through CoreV1Api (method suffix), the rest
# through CustomObjectsApi (plural). A manifest with any other kind is refused, not guessed at.
CORE = {"Service": "service", "ServiceAccount": "service_account", "ConfigMap": "config_map",
        "Pod": "pod", "Event": "event"}
PLURALS = {"RayService": "rayservices", "PodDisruptionBudget": "poddisruptionbudgets", "PodMonitor": "podmonitors",
           "Lease": "leases"}
SHARED_KINDS = ("ServiceAccount", "PodMonitor")
FAILING_WAIT_REASONS = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                        "CreateContainerError", "RunContainerError", "InvalidImageName"}
PROGRESS_EVERY_S = 30.0
LOCK_TTL_S = 120  # a holder renews every quarter of this; a dead holder's lock is taken over after it
RECENT_EVENTS = 10


class RayServiceState(NamedTuple):
    state: Literal["deploying", "ready", "failed"]
    detail: str          # e.g. "RUNNING", "DEPLOYING", "DEPLOY_FAILED: pd-llm: ..."
    terminal: bool       # DEPLOY_FAILED: waiting longer will not help


def rayservice_state(rs: dict[str, Any]) -> RayServiceState:
    """Ready = condition Ready True, no upgrade in progress, every active application RUNNING, status
    observed for the current generation. DEPLOY_FAILED anywhere is terminal; UNHEALTHY is reported
    but waited on (KubeRay replaces a cluster that stays unhealthy past its thresholds)."""
    status = rs.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    services = {"active": status.get("activeServiceStatus") or {}, "pending": status.get("pendingServiceStatus") or {}}
    apps = [(where, name, app) for where, svc in services.items()
            for name, app in (svc.get("applicationStatuses") or {}).items()]
    failed = [f"{name} ({where}): {app.get('message') or 'no message'}" for where, name, app in apps
              if app.get("status") == "DEPLOY_FAILED"]
    if failed:
        return RayServiceState("failed", "DEPLOY_FAILED: " + "; ".join(failed), True)
    active = [app.get("status") for where, _, app in apps if where == "active"]
    ready = conditions.get("Ready", {}).get("status") == "True"
    upgrading = conditions.get("UpgradeInProgress", {}).get("status") == "True"
    generation, observed = (rs.get("metadata") or {}).get("generation"), status.get("observedGeneration")
    current = generation is None or observed is None or observed >= generation
    if ready and not upgrading and current and active and all(s == "RUNNING" for s in active):
        return RayServiceState("ready", "RUNNING", False)
    unhealthy = [f"{name}: {app.get('message') or 'no message'}" for _, name, app in apps if app.get("status") == "UNHEALTHY"]
    if unhealthy:
        return RayServiceState("failed", "UNHEALTHY: " + "; ".join(unhealthy), False)
    seen = sorted({str(app.get("status")) for _, _, app in apps})
    reason = conditions.get("Ready", {}).get("reason")
    return RayServiceState("deploying", "/".join(seen) or reason or "waiting for KubeRay", False)


@dataclass
class _State:
    """What the history ConfigMap holds."""

    release: str | None = None
    history: list[ReleaseRecord] = field(default_factory=list)
    stable: ReleaseRecord | None = None
    candidate: ReleaseRecord | None = None


def _objects(record: ReleaseRecord) -> list[dict[str, Any]]:
    """The manifest's objects; shared between calls, so callers copy before changing them."""
    return _parse(record.manifest)


@functools.lru_cache(maxsize=8)
def _parse(manifest: str) -> list[dict[str, Any]]:
    return [o for o in yaml.load_all(manifest, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if o]


def _only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o.get("kind") == kind]
    if len(found) != 1:
        raise TargetError(f"the manifest holds {len(found)} {kind} objects; the kubernetes target needs exactly one",
                          ["render it with `pdops render OVERLAY` (kustomize/base has one of each)"])
    return found[0]


def _head_port(rayservice: dict[str, Any], name: str, default: int) -> int:
    containers = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    return next((p["containerPort"] for p in containers[0].get("ports") or [] if p.get("name") == name), default)


def _gpu_groups(rayservice: dict[str, Any]) -> list[tuple[str, dict[str, str], int, int]]:
    """(group, nodeSelector, pods, GPUs per pod) of every worker group that asks for GPUs."""
    out = []
    for group in rayservice["spec"]["rayClusterConfig"].get("workerGroupSpecs") or []:
        spec = group.get("template", {}).get("spec", {})
        per_pod = 0
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            per_pod += int(str((resources.get("limits") or {}).get(GPU) or (resources.get("requests") or {}).get(GPU) or 0))
        if per_pod:
            replicas = max(int(group.get("replicas", 0) or 0), int(group.get("minReplicas", 0) or 0))
            out.append((group["groupName"], dict(spec.get("nodeSelector") or {}), replicas * int(group.get("numOfHosts", 1)), per_pod))
    return out


def _node_gpus(node: dict[str, Any]) -> int:
    """Allocatable GPUs of a node that can take new pods (Ready, not cordoned); 0 otherwise."""
    if (node.get("spec") or {}).get("unschedulable"):
        return 0
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    if ready and ready[0].get("status") != "True":
        return 0
    return int(str(((node.get("status") or {}).get("allocatable") or {}).get(GPU) or 0))


def _selector_text(selector: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) + "}" if selector else "{any node}"


class KubernetesTarget:
    """Blue/green RayServices in one namespace, driven with the official `kubernetes` client."""

    kind = "kubernetes"

    def __init__(self, namespace: str, *, kubeconfig: str | None = None, context: str | None = None,
                 dry_run: bool = False, api_client: client.ApiClient | None = None, poll_s: float = 5.0,
                 restore_timeout_s: float = 3600.0, capacity_check: bool = True) -> None:
        """`api_client` replaces kubeconfig loading (tests point it at an emulator). `restore_timeout_s`
        bounds the waits rollback itself does (redeploying a lost stable, `to_previous`).
        `capacity_check=False` is for node groups that an autoscaler grows on demand."""
        self.namespace, self.dry_run, self.poll_s = namespace, dry_run, poll_s
        self.restore_timeout_s, self.capacity_check = restore_timeout_s, capacity_check
        self.api = api_client or _load_client(kubeconfig, context)
        self._core, self._custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self._release: str | None = None
        self._dry_candidate: ReleaseRecord | None = None  # dry runs store nothing; remembered for wait/promote

    # ---- the Target protocol ----

    @contextmanager
    def session(self) -> Iterator[None]:
        """A Lease `pdops-release` in the namespace, renewed while held. Argo's per-environment mutex
        already serialises pipeline runs; this also stops a hand-run release racing one. A holder that
        died stops renewing, and its Lease is taken over LOCK_TTL_S after its last renewal (the
        emulator has no resourceVersion, so that takeover is not compare-and-swap). Dry runs store
        nothing, so they take no lock."""
        if self.dry_run:
            yield
            return
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        self._lock(holder)
        stop = threading.Event()
        def renew() -> None:
            while not stop.wait(LOCK_TTL_S / 4):
                try:
                    self._apply(self._lease(holder, renew=True))
                except TargetError:
                    pass  # retried next time; the lock lapses only when renewals fail for LOCK_TTL_S
        renewer = threading.Thread(target=renew, name="pdops-lease", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            self._delete("Lease", LOCK_NAME, _API_VERSIONS["Lease"])

    def reference(self, record: ReleaseRecord, prompts: list[str], max_tokens: int,
                  progress: Progress) -> list[dict] | None:
        """None: a single-engine reference of a 70B model would be a third GPU deployment; the golden
        token check runs where the local target can run the engine."""
        progress("[validate] golden tokens: no single-engine reference on the kubernetes target; skipped")
        return None

    def status(self) -> TargetStatus:
        state = self._state()
        stable = self._slot_status("stable", state.stable)
        if state.stable and stable.state != "absent":
            selected = self._service_colour(state.stable)
            if selected != state.stable.colour:  # a run died between recording a promote and switching
                stable.state = "failed"
                stable.detail += (f"; but Service {self._service_name(state.stable)} selects {selected or 'nothing'}"
                                  " — `pdops rollback` points it at the stable slot")
        return TargetStatus(target=self.kind, stable=stable, candidate=self._slot_status("candidate", state.candidate),
                            last_good=last_good(state.history))

    def apply(self, record: ReleaseRecord, progress: Progress) -> ReleaseRecord:
        state = self._state(record.name)
        pending = state.candidate or self._dry_candidate
        if pending is not None:
            if pending.digest != record.digest:
                raise TargetError(
                    f"candidate {pending.short()} is pending in {pending.colour}; {record.short()} cannot start",
                    ["run `pdops rollback --if-candidate-pending` first (it records the pending candidate as rolled back)"])
            if self._get("RayService", self._rs_name(pending)) is None:
                progress(f"[rollout] {pending.short()} is pending but its RayService is missing; applying it again")
                self._apply_release(pending, progress)
            else:
                progress(f"[rollout] {pending.short()} is already the pending candidate in {pending.colour}; nothing applied")
            return pending
        if state.stable is not None and state.stable.digest == record.digest:
            progress(f"[rollout] {record.short()} is already stable in {state.stable.colour}; nothing applied")
            return state.stable
        colour = other_colour(state.stable.colour) if state.stable else "blue"
        candidate = record.model_copy(update={"colour": colour, "verdict": "pending", "applied_at": time.time(),
                                              "reasons": [], "decided_at": None})
        self._check_namespace(candidate)
        if self._get("RayService", self._rs_name(candidate)) is not None:
            # Left by a run that died after promote, or still terminating after a rollback: applying
            # over it would upgrade (or lose) it in place, so it goes first.
            progress(f"[rollout] removing leftover RayService {self._rs_name(candidate)} (not recorded in any slot)")
            self._remove_colour(candidate, progress, "rollout")
            self._wait_gone(self._rs_name(candidate), progress)
        self._check_capacity(candidate, state.stable, progress)
        state.candidate = candidate
        self._save(state)  # intent first: a run that dies after this leaves a candidate rollback can remove
        self._apply_release(candidate, progress)
        if self.dry_run:
            self._dry_candidate = candidate
        return candidate

    def wait_ready(self, timeout_s: float, progress: Progress) -> Endpoint:
        candidate = self._candidate(self._state())
        if self.dry_run and candidate is self._dry_candidate:
            progress(f"[rollout] dry run: {self._rs_name(candidate)} was not created; not waiting")
        else:
            self._wait(candidate, timeout_s, progress)
        return self._endpoint("candidate", candidate)

    def endpoint(self, slot: Literal["stable", "candidate"]) -> Endpoint:
        state = self._state()
        record = state.stable if slot == "stable" else (state.candidate or self._dry_candidate)
        if record is None:
            raise TargetError(f"no {slot} release in namespace {self.namespace}",
                              ["run `pdops rollout` (and promote) first"])
        return self._endpoint(slot, record)

    def promote(self, reasons: list[str], report: str | None, progress: Progress, *,
                baseline: list[dict] | None = None) -> ReleaseRecord:
        state = self._state()
        candidate = self._candidate(state)
        if not (self.dry_run and candidate is self._dry_candidate) and self._get("RayService", self._rs_name(candidate)) is None:
            raise TargetError(f"the candidate's RayService {self._rs_name(candidate)} is gone; nothing to promote",
                              ["run `pdops rollback` to record it and check the stable slot"])
        previous = state.stable
        promoted = self._decided(candidate, "promote", reasons, report).model_copy(update={"baseline": baseline})
        state.history, state.stable, state.candidate = appended(state.history, promoted), promoted, None
        self._save(state)  # intent first: rollback re-points the Service if the run dies before the switch
        self._switch(promoted, progress)
        if previous is not None and previous.colour != promoted.colour:
            self._remove_colour(previous, progress, "promote")  # frees its GPUs; history can redeploy it
        self._dry_candidate = None
        return promoted

    def rollback(self, reasons: list[str], report: str | None, progress: Progress, *,
                 to_previous: bool = False) -> str:
        state = self._state()
        done = []
        candidate = state.candidate or self._dry_candidate
        if candidate is not None:
            rs = self._get("RayService", self._rs_name(candidate))
            last = rayservice_state(rs).detail if rs is not None else "RayService absent"
            self._remove_colour(candidate, progress)  # before the record: a retry finds the candidate again
            decided = self._decided(candidate, "rollback", reasons + [f"candidate state at rollback: {last}"], report)
            state.history, state.candidate = appended(state.history, decided), None
            self._save(state)
            self._dry_candidate = None
            done.append(f"dropped candidate {candidate.short()} ({candidate.colour})")
        done.append(self._restore_previous(state, reasons, report, progress) if to_previous
                    else self._ensure_stable(state, progress))
        return "; ".join(done)

    def history(self) -> list[ReleaseRecord]:
        return self._state().history

    # ---- the release lock ----

    def _lease(self, holder: str, renew: bool = False) -> dict[str, Any]:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": holder, "leaseDurationSeconds": LOCK_TTL_S, "renewTime": now}
        return {"apiVersion": _API_VERSIONS["Lease"], "kind": "Lease",
                "metadata": {"name": LOCK_NAME, "namespace": self.namespace, "labels": dict(PART_OF)},
                "spec": spec if renew else {**spec, "acquireTime": now}}

    def _lock(self, holder: str) -> None:
        try:
            self._request("create", "Lease", _API_VERSIONS["Lease"], body=self._lease(holder), field_manager=FIELD_MANAGER)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise _api_error(exc, f"create Lease/{LOCK_NAME}", self.namespace) from None
        spec = (self._get("Lease", LOCK_NAME) or {}).get("spec") or {}
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(renewed.replace("Z", "+00:00"))).total_seconds() if renewed else math.inf
        if age < int(spec.get("leaseDurationSeconds") or LOCK_TTL_S):
            raise TargetError(f"another release is running in namespace {self.namespace}",
                              [f"holder: {spec.get('holderIdentity', 'unknown')}, renewed {age:.0f}s ago (Lease {LOCK_NAME}); "
                               "wait for it to finish; a holder that died loses the lock "
                               f"{LOCK_TTL_S}s after its last renewal"])
        self._apply(self._lease(holder))  # the holder died: take over

    # ---- slots ----

    def _candidate(self, state: _State) -> ReleaseRecord:
        candidate = state.candidate or self._dry_candidate
        if candidate is None:
            raise TargetError(f"no candidate is pending in namespace {self.namespace}", ["run `pdops rollout` first"])
        return candidate

    def _decided(self, record: ReleaseRecord, verdict: str, reasons: list[str], report: str | None) -> ReleaseRecord:
        return record.model_copy(update={"verdict": verdict, "reasons": list(reasons), "report": report,
                                         "decided_at": time.time()})

    def _slot_status(self, slot: Literal["stable", "candidate"], record: ReleaseRecord | None) -> SlotStatus:
        if record is None:
            return SlotStatus(slot=slot)
        rs = self._get("RayService", self._rs_name(record))
        if rs is None:
            return SlotStatus(slot=slot, release=record, state="absent", detail=f"RayService {self._rs_name(record)} not found")
        found = rayservice_state(rs)
        return SlotStatus(slot=slot, release=record, state=found.state, detail=f"{self._rs_name(record)}: {found.detail}",
                          endpoint=self._endpoint(slot, record))

    def _ensure_stable(self, state: _State, progress: Progress) -> str:
        """The stable slot's RayService exists (redeployed from its record if not), the Service selects
        it, and no RayService of this release is left in the other colour."""
        stable = state.stable or last_good(state.history)
        if stable is None:
            return "no stable release recorded; nothing to restore"
        redeployed = ""
        if self._get("RayService", self._rs_name(stable)) is None:
            progress(f"[rollback] stable RayService {self._rs_name(stable)} is missing; redeploying {stable.short()} from history")
            self._apply_release(stable, progress)
            if not self.dry_run:
                self._wait(stable, self.restore_timeout_s, progress)
            redeployed = "redeployed from history, "
        if self._service_colour(stable) != stable.colour:
            self._switch(stable, progress)
        other = stable.model_copy(update={"colour": other_colour(stable.colour)})
        if self._get("RayService", self._rs_name(other)) is not None:
            self._remove_colour(other, progress)
        return f"stable {stable.short()} ({stable.colour}) {redeployed}serving"

    def _restore_previous(self, state: _State, reasons: list[str], report: str | None, progress: Progress) -> str:
        """Mark the current stable regressed and bring back the good release before it, validated by
        KubeRay readiness in the other colour before traffic moves."""
        current = state.stable
        if current is None:
            raise TargetError("no stable release to roll back from", ["`pdops status` shows what the cluster holds"])
        history = list(state.history)
        index = next((i for i in range(len(history) - 1, -1, -1)
                      if history[i].digest == current.digest and history[i].verdict == "promote"), None)
        if index is not None:
            history[index] = self._decided(history[index], "regressed", reasons, report)
        previous = last_good(history)
        if previous is None:
            raise TargetError(f"no good release before {current.short()} in the history ConfigMap",
                              ["roll forward with a fixed release instead (`pdops rollout`)"])
        restore = previous.model_copy(update={"colour": other_colour(current.colour), "verdict": "pending",
                                              "applied_at": time.time(), "decided_at": None, "reasons": [], "report": None})
        self._check_capacity(restore, current, progress)
        state.history, state.stable = history, current.model_copy(update={"verdict": "regressed"})
        state.candidate = restore
        self._save(state)
        self._apply_release(restore, progress)
        if not self.dry_run:
            self._wait(restore, self.restore_timeout_s, progress)
        promoted = self._decided(restore, "promote", [f"restored: {current.short()} regressed"] + reasons, report)
        state.history, state.stable, state.candidate = appended(state.history, promoted), promoted, None
        self._save(state)
        self._switch(promoted, progress)
        self._remove_colour(current, progress)
        return f"{current.short()} marked regressed; {previous.short()} restored in {restore.colour} and serving"

    # ---- objects of a release ----

    def _rs_name(self, record: ReleaseRecord) -> str:
        return f"{_only(_objects(record), 'RayService')['metadata']['name']}-{record.colour}"

    def _service_name(self, record: ReleaseRecord) -> str:
        return _only(_objects(record), "Service")["metadata"]["name"]

    def _check_namespace(self, record: ReleaseRecord) -> None:
        others = sorted({o["metadata"]["namespace"] for o in _objects(record) if o.get("metadata", {}).get("namespace")} - {self.namespace})
        if others:
            raise TargetError(f"the manifest is rendered for namespace {', '.join(others)}, the target is {self.namespace}",
                              ["pass --namespace matching the overlay's kustomization, or render the overlay for this namespace"])
        unknown = sorted({o["kind"] for o in _objects(record)} - set(CORE) - set(PLURALS))
        if unknown:
            raise TargetError(f"the kubernetes target does not apply {', '.join(unknown)}",
                              [f"it applies {', '.join(sorted(set(CORE) | set(PLURALS)))}; remove the others from the overlay"])

    def _release_objects(self, record: ReleaseRecord) -> list[dict[str, Any]]:
        """What a rollout applies for `record` in its colour (the Service is left for promote)."""
        colour, out = record.colour, []
        for obj in _objects(record):
            obj = json.loads(json.dumps(obj))
            meta = obj.setdefault("metadata", {})
            meta["namespace"] = self.namespace
            if obj["kind"] == "RayService":
                meta["name"] = self._rs_name(record)
                meta.setdefault("labels", {}).update({COLOUR_LABEL: colour, RELEASE_LABEL: record.name})
                meta.setdefault("annotations", {}).update({DIGEST_ANNOTATION: record.digest, REVISION_ANNOTATION: record.revision})
                cluster = obj["spec"]["rayClusterConfig"]
                for group in [cluster["headGroupSpec"], *(cluster.get("workerGroupSpecs") or [])]:
                    group.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})[COLOUR_LABEL] = colour
            elif obj["kind"] == "PodDisruptionBudget":
                meta["name"] = f"{meta['name']}-{colour}"
                meta.setdefault("labels", {})[COLOUR_LABEL] = colour
                obj["spec"].setdefault("selector", {}).setdefault("matchLabels", {})[COLOUR_LABEL] = colour
            elif obj["kind"] == "PodMonitor":
                labels = obj["spec"].setdefault("podTargetLabels", [])
                if COLOUR_LABEL not in labels:
                    labels.append(COLOUR_LABEL)
            elif obj["kind"] not in SHARED_KINDS:
                continue
            out.append(obj)
        return out

    def _stable_service(self, record: ReleaseRecord) -> dict[str, Any]:
        service = json.loads(json.dumps(_only(_objects(record), "Service")))
        service["metadata"]["namespace"] = self.namespace
        service["metadata"].setdefault("annotations", {}).update(
            {COLOUR_LABEL: record.colour, DIGEST_ANNOTATION: record.digest, REVISION_ANNOTATION: record.revision})
        service["spec"]["selector"] = {**service["spec"].get("selector", {}), COLOUR_LABEL: record.colour,
                                       NODE_TYPE_LABEL: "head", SERVE_LABEL: "true"}
        return service

    def _apply_release(self, record: ReleaseRecord, progress: Progress) -> None:
        for obj in self._release_objects(record):
            self._apply(obj)
            progress(f"[rollout] applied {obj['kind']}/{obj['metadata']['name']}{' (dry run)' if self.dry_run else ''}")

    def _switch(self, record: ReleaseRecord, progress: Progress) -> None:
        service = self._stable_service(record)
        self._apply(service)
        progress(f"[promote] Service {service['metadata']['name']} now selects {record.colour} "
                 f"({self._rs_name(record)}, {record.short()}){' (dry run)' if self.dry_run else ''}")

    def _service_colour(self, record: ReleaseRecord) -> str | None:
        service = self._get("Service", self._service_name(record))
        return ((service or {}).get("spec") or {}).get("selector", {}).get(COLOUR_LABEL)

    def _remove_colour(self, record: ReleaseRecord, progress: Progress, step: str = "rollback") -> None:
        """Delete a colour's RayService and PDBs (KubeRay deletes its RayCluster and pods)."""
        for obj in self._release_objects(record):
            if obj["kind"] in SHARED_KINDS:
                continue
            if self._delete(obj["kind"], obj["metadata"]["name"], obj["apiVersion"]):
                progress(f"[{step}] deleted {obj['kind']}/{obj['metadata']['name']}{' (dry run)' if self.dry_run else ''}")

    def _wait_gone(self, name: str, progress: Progress) -> None:
        start = time.monotonic()
        while not self.dry_run and self._get("RayService", name) is not None:
            if time.monotonic() - start >= self.restore_timeout_s:
                raise TargetError(f"RayService {name} is still terminating after {self.restore_timeout_s:.0f}s",
                                  [f"`kubectl -n {self.namespace} get rayservice {name} -o yaml` shows its finalizers"])
            time.sleep(self.poll_s)
        progress(f"[rollout] {name} is gone")

    def _endpoint(self, slot: str, record: ReleaseRecord) -> Endpoint:
        rayservice = _only(_objects(record), "RayService")
        ns, name = self.namespace, self._rs_name(record)
        metrics = f"http://{name}-head-svc.{ns}.svc.cluster.local:{_head_port(rayservice, 'metrics', 8080)}/metrics"
        if slot == "stable":
            service = _only(_objects(record), "Service")
            port = (service["spec"].get("ports") or [{"port": 8000}])[0]["port"]
            return Endpoint(base_url=f"http://{service['metadata']['name']}.{ns}.svc.cluster.local:{port}/v1",
                            metrics_url=metrics, metrics_lag_s=RAY_METRICS_LAG_S)
        # KubeRay names a RayService's serve Service <name>-serve-svc (utils.GenerateServeServiceName).
        return Endpoint(base_url=f"http://{name}-serve-svc.{ns}.svc.cluster.local:{_head_port(rayservice, 'serve', 8000)}/v1",
                        metrics_url=metrics, metrics_lag_s=RAY_METRICS_LAG_S)

    # ---- readiness ----

    def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress) -> None:
        name, start, last, last_at = self._rs_name(record), time.monotonic(), "", 0.0
        while True:
            elapsed = time.monotonic() - start
            rs = self._get("RayService", name)
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
        """Failing pods of the colour and recent namespace Events about its objects (RayService,
        RayCluster `<name>-xxxxx`, pods), newest last."""
        name, colour = self._rs_name(record), record.colour
        out = []
        pods = self._list("Pod", label_selector=f"{COLOUR_LABEL}={colour}")
        for pod in pods:
            if (pod.get("metadata", {}).get("labels") or {}).get(COLOUR_LABEL) != colour:
                continue  # API servers without label selectors (the test emulator) return every pod
            out += _pod_problems(pod)
        events = [e for e in self._list("Event")
                  if (e.get("involvedObject") or {}).get("name", "").startswith(name)]
        events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or e.get("metadata", {}).get("creationTimestamp") or ""))
        for event in events[-RECENT_EVENTS:]:
            obj = event.get("involvedObject") or {}
            out.append(f"event {event.get('type', '')} {event.get('reason', '')} {obj.get('kind', '')}/{obj.get('name', '')}: "
                       f"{event.get('message', '')}".strip())
        return out or [f"no failing pods or events found for {name}; `kubectl -n {self.namespace} describe rayservice {name}`"]

    # ---- capacity ----

    def _check_capacity(self, candidate: ReleaseRecord, stable: ReleaseRecord | None, progress: Progress) -> None:
        """The candidate's GPU worker groups must fit on their nodes next to the stable slot's: KubeRay
        leaves a RayCluster that does not fit Pending, and the rollout hangs until the timeout."""
        wanted = _gpu_groups(_only(_objects(candidate), "RayService"))
        if not wanted:
            progress("[capacity] the manifest asks for no GPUs; no capacity check")
            return
        if not self.capacity_check:
            progress("[capacity] check disabled (capacity_check=False)")
            return
        try:
            nodes = self._call("list_node")
        except ApiException as exc:
            if exc.status != 403:
                raise _api_error(exc, "list nodes", self.namespace) from None
            progress("[capacity] skipped: listing nodes is forbidden (nodes are cluster-scoped; the pd-release Role is "
                     "namespaced). Bind the ClusterRole `pdops-node-reader` (README, Install on EKS) to enable the check")
            return
        stable_rs = self._get("RayService", self._rs_name(stable)) if stable else None
        used = _gpu_groups(stable_rs) if stable_rs else []
        selectors = {tuple(sorted(sel.items())) for _, sel, _, _ in wanted}
        short = []
        for key in sorted(selectors):
            selector = dict(key)
            groups = [g for g in wanted if g[1] == selector]
            matching = [n for n in nodes if all((n.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in key)]
            allocatable = sum(_node_gpus(n) for n in matching)
            in_use = sum(pods * per for _, sel, pods, per in used if sel == selector)
            need = sum(pods * per for _, _, pods, per in groups)
            free = allocatable - in_use
            line = (f"nodes {_selector_text(selector)}: candidate needs {need} {GPU} "
                    f"({', '.join(f'{g}: {pods} x {per}' for g, _, pods, per in groups)}); "
                    f"allocatable {allocatable} on {len(matching)} node(s), stable uses {in_use}, free {free}")
            progress(f"[capacity] {line}")
            if need > free:
                per_node = max([_node_gpus(n) for n in matching] + [max(per for _, _, _, per in groups)])
                short.append(f"{line}: short by {need - free} — add {math.ceil((need - free) / per_node)} such node(s)")
        if short:
            raise TargetError(
                f"not enough GPUs for candidate {self._rs_name(candidate)} next to the stable slot", short + [
                    "blue/green runs a new RayCluster beside the stable one until promotion, so it needs its GPUs in "
                    "addition to the stable slot's; without them KubeRay leaves its pods Pending and the rollout hangs",
                    "fix: scale the node group(s) named above (eksctl scale nodegroup, or raise the Karpenter NodePool "
                    "limits), or free GPUs, then re-run; if an autoscaler adds GPU nodes on demand, disable the check "
                    "(capacity_check=False)"])

    # ---- the history ConfigMap ----

    def _history_name(self, release: str) -> str:
        return f"pdops-history-{release}"

    def _state(self, release: str | None = None) -> _State:
        """Read the slots and history; the release is found by label when no record names it (one
        release per namespace)."""
        release = release or self._release
        if release is None:
            found = [c for c in self._list("ConfigMap") if HISTORY_LABEL in (c.get("metadata", {}).get("labels") or {})]
            if len(found) > 1:
                names = sorted(c["metadata"]["name"] for c in found)
                raise TargetError(f"several pdops releases in namespace {self.namespace}: {', '.join(names)}",
                                  ["keep one release per namespace (one RayService per environment)"])
            if not found:
                return _State()
            release = found[0]["metadata"]["labels"][HISTORY_LABEL]
        self._release = release
        cm = self._get("ConfigMap", self._history_name(release))
        data = (cm or {}).get("data") or {}
        slots = json.loads(data.get("slots.json") or "{}")
        def one(key: str) -> ReleaseRecord | None:
            return ReleaseRecord.model_validate(slots[key]) if slots.get(key) else None
        return _State(release=release, history=[ReleaseRecord.model_validate(r) for r in json.loads(data.get("history.json") or "[]")],
                      stable=one("stable"), candidate=one("candidate"))

    def _save(self, state: _State) -> None:
        release = state.release or self._release
        def dump(r: ReleaseRecord | None) -> Any:
            return r.model_dump(mode="json") if r else None
        self._apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self._history_name(release), "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/part-of": "pdops", "app.kubernetes.io/managed-by": "pdops",
                                    HISTORY_LABEL: release}},
            "data": {"history.json": json.dumps([dump(r) for r in state.history]),
                     "slots.json": json.dumps({"stable": dump(state.stable), "candidate": dump(state.candidate)})},
        })

    # ---- API calls ----

    def _invoke(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except urllib3.exceptions.HTTPError as exc:
            raise TargetError(f"cannot reach the Kubernetes API at {self.api.configuration.host}: {exc}",
                              ["check --kubeconfig/--context and that the cluster endpoint is reachable"],
                              transient=True) from None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A CoreV1Api call as plain JSON (the typed models would reject partial objects)."""
        response = self._invoke(getattr(self._core, method), *args, _preload_content=False, **kwargs)
        data = json.loads(response.data or b"null")
        return data["items"] if method.startswith("list") else data

    def _request(self, verb: str, kind: str, api_version: str, name: str | None = None,
                 body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        args = [a for a in (name, self.namespace, body) if a is not None]
        if kind in CORE:
            core_verb = {"get": "read"}.get(verb, verb)
            return self._call(f"{core_verb}_namespaced_{CORE[kind]}", *args, **kwargs)
        group, _, version = api_version.rpartition("/")
        args = [group, version, self.namespace, PLURALS[kind]] + [a for a in (name, body) if a is not None]
        data = self._invoke(getattr(self._custom, f"{verb}_namespaced_custom_object"), *args, **kwargs)
        return data["items"] if verb == "list" else data

    def _apply(self, obj: dict[str, Any]) -> None:
        kind, name, version = obj["kind"], obj["metadata"]["name"], obj["apiVersion"]
        dry = {"dry_run": "All"} if self.dry_run else {}
        try:
            try:
                self._request("patch", kind, version, name, obj, field_manager=FIELD_MANAGER, force=True,
                              _content_type=APPLY_PATCH, **dry)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            # A real API server creates the object on apply; only one without server-side apply
            # semantics (the test emulator) answers 404, so create it there.
            self._request("create", kind, version, body=obj, field_manager=FIELD_MANAGER, **dry)
        except ApiException as exc:
            raise _api_error(exc, f"apply {kind}/{name}", self.namespace) from None

    def _get(self, kind: str, name: str, api_version: str = "") -> dict[str, Any] | None:
        try:
            return self._request("get", kind, api_version or _API_VERSIONS[kind], name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(exc, f"get {kind}/{name}", self.namespace) from None

    def _delete(self, kind: str, name: str, api_version: str) -> bool:
        try:
            self._request("delete", kind, api_version, name, **({"dry_run": "All"} if self.dry_run else {}))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _api_error(exc, f"delete {kind}/{name}", self.namespace) from None

    def _list(self, kind: str, **kwargs: Any) -> list[dict[str, Any]]:
        try:
            return self._request("list", kind, _API_VERSIONS[kind], **kwargs) or []
        except ApiException as exc:
            if exc.status == 404:  # an emulator that has never seen the kind
                return []
            raise _api_error(exc, f"list {kind}", self.namespace) from None


_API_VERSIONS = {"RayService": "ray.io/v1", "PodDisruptionBudget": "policy/v1", "PodMonitor": "monitoring.coreos.com/v1",
                 "Lease": "coordination.k8s.io/v1", **{kind: "v1" for kind in CORE}}


def _pod_problems(pod: dict[str, Any]) -> list[str]:
    """Why a pod is not serving, in kubectl's words: unschedulable, crash-looping, image pulls."""
    name, status = pod.get("metadata", {}).get("name", "?"), pod.get("status") or {}
    out = []
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(f"pod {name}: {status.get('phase', 'Pending')}, {cond.get('reason', 'not scheduled')}: {cond.get('message', '')}".rstrip(": "))
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            last = ((cs.get("lastState") or {}).get("terminated") or {})
            died = f"; last exit: {last.get('reason', '?')} (code {last.get('exitCode', '?')})" if last else ""
            out.append(f"pod {name} container {cs.get('name')}: {waiting['reason']} (restarts {cs.get('restartCount', 0)}){died}"
                       + (f": {waiting['message']}" if waiting.get("message") else ""))
    if status.get("phase") == "Failed":
        out.append(f"pod {name}: Failed ({status.get('reason', '')}: {status.get('message', '')})")
    return out


def _api_error(exc: ApiException, what: str, namespace: str) -> TargetError:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    details = [str(message)]
    if exc.status == 403:
        details.append("the pd-release Role (kustomize/argo/rbac.yaml) grants what rollout/promote/rollback need in "
                       f"{namespace}; check the ServiceAccount the step runs as")
    # 5xx and 429 are the API server's "try again" (client-go's rest client retries them too);
    # 0 is no HTTP answer at all. 4xx are answers about the request: retrying changes nothing.
    transient = exc.status is None or exc.status == 0 or exc.status == 429 or exc.status >= 500
    return TargetError(f"Kubernetes API refused to {what} in {namespace}: {exc.status} {exc.reason}", details,
                       transient=transient)


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
                          ["pass --kubeconfig FILE (and --context NAME), or run in the cluster as the pd-release ServiceAccount"]) from None
