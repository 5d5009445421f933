"""The single-engine reference on the cluster: a short-lived RayService `<name>-reference`.

Golden tokens and `pdops diff` compare the P/D candidate with ONE plain engine of the same model.
On Kubernetes that engine is a RayService derived from the release's rendered one: the same head
group, one pod of the decode worker group (replicas = min = max = 1, its numOfHosts kept), and a
serveConfigV2 with one aggregated Ray Serve LLM application (`ray.serve.llm:build_openai_app`, the
decode llm_config minus kv_transfer_config and the P/D-only settings: serve_config.py
reference_serve_config, checked by Ray's LLMServingArgs). It is labelled `pdops.dev/role=reference`
(also on its pod templates, which KubeRay copies onto the pods) and carries no colour, so neither
the stable Service, a colour's PDBs nor a colour's metrics ever select its pods; the label is how
status, rollback and the next release find one a killed run left behind.

Lifecycle (References.reference_server): remove a leftover, check room for the reference's pods
(capacity.py; the candidate and stable hold their GPUs meanwhile), apply, wait for KubeRay's
RUNNING and a ready endpoint of `<rs>-serve-svc` (KubeRay's serve Service), yield its URL, then
delete it (uid precondition: never another run's) and wait until KubeRay's finalizer lets it go.
No room or never ready: nothing is half applied, and the checks are reported skipped with why.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import yaml

from workflows.errors import InputError
from workflows.names import DIGEST_ANNOTATION, PHASE_LABEL, RELEASE_LABEL, REVISION_ANNOTATION, ROLE_LABEL
from workflows.render.manifest import dump_yaml, serve_config_of
from workflows.render.serve_config import reference_serve_config
from workflows.targets.base import Progress, ReleaseRecord, Skipped, TargetError
from workflows.targets.kube import objects as obj
from workflows.targets.kube.readiness import event_lines, pod_problems, rayservice_state
from workflows.targets.polling import Poll

ROLE = "reference"


def name_of(record: ReleaseRecord) -> str:
    return f"{obj.only(record, 'RayService')['metadata']['name']}-{ROLE}"


def _decode_group(cluster: dict[str, Any]) -> dict[str, Any]:
    groups = cluster.get("workerGroupSpecs") or []
    found = [g for g in groups
             if ((g.get("template") or {}).get("metadata") or {}).get("labels", {}).get(PHASE_LABEL) == "decode"]
    found = found or [g for g in groups if g.get("groupName") == "decode"]
    if len(found) != 1:
        raise TargetError(f"the RayService has {len(found)} decode worker groups; the reference needs exactly one",
                          [f"label the decode group's pod template {PHASE_LABEL}: decode (kustomize/base does)"])
    return found[0]


def rayservice(record: ReleaseRecord, namespace: str) -> dict[str, Any]:
    """The reference RayService for `record` (see the module docstring)."""
    rs = obj.only(record, "RayService")
    name = name_of(record)
    meta = {"name": name, "namespace": namespace,
            "labels": {**(rs["metadata"].get("labels") or {}), RELEASE_LABEL: record.name, ROLE_LABEL: ROLE},
            "annotations": {DIGEST_ANNOTATION: record.digest, REVISION_ANNOTATION: record.revision}}
    cluster = copy.deepcopy(rs["spec"]["rayClusterConfig"])
    decode = _decode_group(cluster)
    decode.update(replicas=1, minReplicas=1, maxReplicas=1)
    cluster["workerGroupSpecs"] = [decode]
    for group in (cluster["headGroupSpec"], decode):
        group.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})[ROLE_LABEL] = ROLE
    try:
        serve = reference_serve_config(serve_config_of(rs), name)
    except InputError as exc:
        raise TargetError(f"cannot derive the single-engine reference: {exc.problem}",
                          [f"field {exc.field}", exc.fix] if exc.fix else [f"field {exc.field}"]) from None
    spec = {"rayClusterConfig": cluster, "serveConfigV2": dump_yaml(serve), "upgradeStrategy": {"type": "None"}}
    return {"apiVersion": rs["apiVersion"], "kind": "RayService", "metadata": meta, "spec": spec}


def engine_identity(reference: dict[str, Any]) -> dict[str, Any]:
    """What the reference's answers depend on: the llm_config and the images that run it."""
    cluster = reference["spec"]["rayClusterConfig"]
    images = sorted({c.get("image", "") for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
                     for c in (g.get("template") or {}).get("spec", {}).get("containers") or []})
    args = yaml.safe_load(reference["spec"]["serveConfigV2"])["applications"][0]["args"]
    return {"args": args, "images": images}


class References:
    """Mixin of KubernetesTarget (target.py supplies kube, the lock, the capacity check and _wait_gone)."""

    kube: Any
    namespace: str
    dry_run: bool
    poll_s: float
    reference_timeout_s: float
    _reference_skips: dict[str, str]
    _check_lock: Callable[[], None]
    _wait_gone: Callable[..., None]
    _room: Callable[..., list[str]]
    _unplaceable: Callable[[str], str | None]

    @contextmanager
    def reference_server(self, record: ReleaseRecord, progress: Progress) -> Iterator[str | Skipped]:
        name = name_of(record)
        if self.dry_run:
            progress(f"[reference] dry run: RayService {name} is not created; golden tokens and diff skipped")
            yield Skipped("dry run: no reference RayService created")
            return
        if (why := self._reference_skips.get(record.digest)) is not None:   # once per release, not twice
            progress(f"[reference] skipped again: {why}")
            yield Skipped(why)
            return
        self.remove_references(progress)
        wanted = rayservice(record, self.namespace)
        short = self._room(wanted, progress, "reference")
        if short:
            why = self._reference_skips[record.digest] = "no room for one decode pod: " + "; ".join(short)
            progress(f"[reference] skipped: {why}")
            yield Skipped(why)
            return
        self._check_lock()
        uid = self.kube.apply(wanted)["metadata"]["uid"]
        progress(f"[reference] applied RayService/{name}: one {record.model} engine on one decode pod")
        try:
            url, why = self._wait_reference(record, wanted, progress)
            if url is None:
                self._reference_skips[record.digest] = why
                progress(f"[reference] skipped: {why}")
            yield url or Skipped(why)
        finally:
            self._delete_owned(name, uid, progress)

    def remove_references(self, progress: Progress, step: str = "reference") -> list[str]:
        """Delete every reference RayService in the namespace (a killed run's) and wait until gone."""
        return self._remove_role(ROLE, progress, step)

    def _remove_role(self, role: str, progress: Progress, step: str) -> list[str]:
        """Delete every RayService labelled `role` (reference, baseline) and wait until each is gone.
        Idempotent: with none left it does nothing."""
        removed = []
        for rs in self.kube.list("RayService", {ROLE_LABEL: role}):
            name = rs["metadata"]["name"]
            revision = (rs["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION, "?")[:12]
            progress(f"[{step}] removing leftover {role} RayService {name} (revision {revision}, from a run that "
                     "did not finish)")
            self._check_lock()
            self.kube.delete("RayService", name)
            self._wait_gone(name, progress, step)
            removed.append(name)
        return removed

    def _wait_reference(self, record: ReleaseRecord, wanted: dict, progress: Progress) -> tuple[str | None, str]:
        """(serve URL, "") once RUNNING with a ready serve endpoint, else (None, why not)."""
        name = name_of(record)
        containers = wanted["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
        port = next((p["containerPort"] for p in containers[0].get("ports") or [] if p.get("name") == "serve"), 8000)
        if why := self._wait_role(name, ROLE, progress):
            return None, why
        return f"http://{name}-serve-svc.{self.namespace}.svc.cluster.local:{port}/v1", ""

    def _wait_role(self, name: str, role: str, progress: Progress) -> str:
        """"" once RayService `name` of `role` (reference, baseline) is RUNNING with a ready serve endpoint,
        else why not (bounded by reference_timeout_s)."""
        start, last, poll = time.monotonic(), "", Poll(self.poll_s)
        service = f"{name}-serve-svc"   # KubeRay utils.GenerateServeServiceName
        while True:
            self._check_lock()   # a lost lock stops here; the finally still deletes what is ours
            elapsed = time.monotonic() - start
            rs = self.kube.get("RayService", name)
            if rs is None:
                return f"{role} RayService {name} was deleted while waiting for it"
            found = rayservice_state(rs)
            if found.state == "ready" and self._serve_endpoints(service):
                progress(f"[{role}] {name}: RUNNING ({elapsed:.0f}s)")
                return ""
            if found.detail != last:
                progress(f"[{role}] {name}: {found.detail} ({elapsed:.0f}s)")
                last = found.detail
            if (stuck := self._unplaceable(role)) is not None:
                return f"{role} RayService {name} cannot start: {stuck}"
            if found.terminal or elapsed >= self.reference_timeout_s:
                what = "failed" if found.terminal else f"not ready after {self.reference_timeout_s:.0f}s"
                return f"{role} RayService {name} {what}: {found.detail}" + "".join(
                    f"; {line}" for line in self._role_diagnosis(name, role)[:4])
            poll.sleep()

    def _serve_endpoints(self, service: str) -> int:
        slices = self.kube.list("EndpointSlice", {"kubernetes.io/service-name": service})
        return sum(1 for s in slices for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready") is not False)

    def _role_diagnosis(self, name: str, role: str = ROLE) -> list[str]:
        """Why RayService `name` of `role` (reference, baseline) does not serve: its pods' problems, then its events."""
        out = [line for pod in self.kube.list("Pod", {ROLE_LABEL: role}) for line in pod_problems(pod)]
        return out + event_lines(self.kube.list("Event"), name, 3)

    def _delete_owned(self, name: str, uid: str, progress: Progress, step: str = ROLE) -> None:
        """Delete our RayService `name` (uid precondition) and wait until KubeRay's finalizer has let it go;
        a lost lock does not stop this (the object is ours whoever holds the lock now). `step`: reference
        or baseline, for the progress lines."""
        for attempt in range(3):
            try:
                if self.kube.delete("RayService", name, uid=uid):
                    progress(f"[{step}] deleted RayService/{name}")
                self._wait_gone(name, progress, step)
                return
            except TargetError as exc:
                if getattr(exc, "status", None) == 409:   # another run's object of that name now: not ours
                    return
                progress(f"[{step}] deleting RayService/{name} failed ({exc.problem}); "
                         + ("retrying" if attempt < 2 else "the next release or `pdops rollback` removes it"))
                time.sleep(self.poll_s)
