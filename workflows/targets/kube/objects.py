"""What the Kubernetes target applies for a release in a colour, derived from its rendered manifest.

- RayService: renamed `<name>-<colour>`, labelled `pdops.dev/colour`; the label goes on every pod
  template too, because KubeRay copies template labels onto pods (common/pod.go labelPod) but not
  the RayService's name.
- PodDisruptionBudgets: one set per colour (renamed, selector narrowed to the colour), so a
  crash-looping candidate never counts against the stable slot's drains. Their spec is applied as
  `pdops render` emits it: the integer `minAvailable` form (workflows/render/pdb.py says why maxUnavailable
  cannot work for RayCluster-owned pods); only a release recorded before render did so is converted.
- ServiceAccount, PodMonitor: shared, applied as rendered. The render's PodMonitor already lists
  `pdops.dev/colour` and `pdops.dev/phase` in podTargetLabels (workflows/render/monitor.py), which carry
  each pod's colour and phase into every scraped series; only a release recorded before render did
  so is converted here.
- The stable Service (applied on promote only) selects `pdops.dev/colour=<c>` and
  `ray.io/serve=true`: every serving pod of that colour, as KubeRay's own serve Service does
  (common/service.go BuildServeService: ray.io/cluster + ray.io/serve=true). Worker pods carry
  serve=true from creation and are gated by their readiness probe; the head only once its proxy
  is healthy (rayservice_controller.go updateHeadPodServeLabel). Selecting the head alone would
  send all traffic through one proxy and leave no endpoint when its health check fails.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import yaml

from workflows.names import COLOUR_LABEL, DIGEST_ANNOTATION, RELEASE_LABEL, REVISION_ANNOTATION
from workflows.render.monitor import with_slot_labels
from workflows.render.pdb import as_min_available, group_pods
from workflows.targets.base import ReleaseRecord, TargetError
from workflows.targets.kube.api import KINDS

SERVE_LABEL, NODE_TYPE_LABEL = "ray.io/serve", "ray.io/node-type"
SHARED_KINDS = ("ServiceAccount", "PodMonitor")
MANIFEST_KINDS = ("RayService", "PodDisruptionBudget", "Service", "ServiceAccount", "PodMonitor")


@functools.lru_cache(maxsize=8)
def _parse(manifest: str) -> list[dict[str, Any]]:
    return [o for o in yaml.load_all(manifest, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if o]


def objects(record: ReleaseRecord) -> list[dict[str, Any]]:
    """The manifest's objects (copies)."""
    return copy.deepcopy(_parse(record.manifest))


def only(record: ReleaseRecord, kind: str) -> dict[str, Any]:
    found = [o for o in _parse(record.manifest) if o.get("kind") == kind]
    if len(found) != 1:
        raise TargetError(f"the manifest holds {len(found)} {kind} objects; the kubernetes target needs exactly one",
                          ["render it with `pdops render OVERLAY` (kustomize/base has one of each)"])
    return copy.deepcopy(found[0])


def rs_name(record: ReleaseRecord) -> str:
    return f"{only(record, 'RayService')['metadata']['name']}-{record.colour}"


def service_name(record: ReleaseRecord) -> str:
    return only(record, "Service")["metadata"]["name"]


def check(record: ReleaseRecord, namespace: str) -> None:
    others = sorted({o["metadata"]["namespace"] for o in _parse(record.manifest)
                     if o.get("metadata", {}).get("namespace")} - {namespace})
    if others:
        raise TargetError(f"the manifest is rendered for namespace {', '.join(others)}, the target is {namespace}",
                          ["pass --namespace matching the overlay's kustomization, "
                           "or render the overlay for this namespace"])
    unknown = sorted({o["kind"] for o in _parse(record.manifest)} - set(MANIFEST_KINDS))
    if unknown:
        raise TargetError(f"the kubernetes target does not apply {', '.join(unknown)}",
                          [f"it applies {', '.join(MANIFEST_KINDS)}; remove the others from the overlay"])


def _pdb(pdb: dict[str, Any], colour: str, pods: dict[str, int]) -> dict[str, Any]:
    meta, spec = pdb["metadata"], pdb["spec"]
    meta["name"] = f"{meta['name']}-{colour}"
    meta.setdefault("labels", {})[COLOUR_LABEL] = colour
    spec.setdefault("selector", {}).setdefault("matchLabels", {})[COLOUR_LABEL] = colour
    # a render is already in this form (pdb.py); a release recorded before it was is converted here
    problem = as_min_available(pdb, pods)
    if problem:
        raise TargetError(f"PodDisruptionBudget {meta['name']}: {problem}", [])
    return pdb


def release_objects(record: ReleaseRecord, namespace: str) -> list[dict[str, Any]]:
    """What a rollout applies for `record` in its colour (the Service is left for promote)."""
    colour, out = record.colour, []
    pods = group_pods(only(record, "RayService"))
    for obj in objects(record):
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        if obj["kind"] == "RayService":
            meta["name"] = rs_name(record)
            meta.setdefault("labels", {}).update({COLOUR_LABEL: colour, RELEASE_LABEL: record.name})
            meta.setdefault("annotations", {}).update({DIGEST_ANNOTATION: record.digest,
                                                       REVISION_ANNOTATION: record.revision})
            cluster = obj["spec"]["rayClusterConfig"]
            for group in [cluster["headGroupSpec"], *(cluster.get("workerGroupSpecs") or [])]:
                meta_of_pods = group.setdefault("template", {}).setdefault("metadata", {})
                meta_of_pods.setdefault("labels", {})[COLOUR_LABEL] = colour
        elif obj["kind"] == "PodDisruptionBudget":
            obj = _pdb(obj, colour, pods)
        elif obj["kind"] == "PodMonitor":   # colour and phase select a slot's engines in Prometheus (traffic.py)
            # a render already lists them (monitor.py); a release recorded before it did is converted here
            with_slot_labels(obj)
        elif obj["kind"] not in SHARED_KINDS:
            continue
        out.append(obj)
    return out


def stable_service(record: ReleaseRecord, namespace: str) -> dict[str, Any]:
    service = only(record, "Service")
    service["metadata"]["namespace"] = namespace
    service["metadata"].setdefault("annotations", {}).update(
        {COLOUR_LABEL: record.colour, DIGEST_ANNOTATION: record.digest, REVISION_ANNOTATION: record.revision})
    selector = {k: v for k, v in (service["spec"].get("selector") or {}).items() if k != NODE_TYPE_LABEL}
    service["spec"]["selector"] = {**selector, COLOUR_LABEL: record.colour, SERVE_LABEL: "true"}
    return service


def api_version(kind: str) -> str:
    return KINDS[kind][0]
