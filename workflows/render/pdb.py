"""PodDisruptionBudgets of KubeRay pods in the form the disruption controller can honour.

`maxUnavailable` (and any percentage) is resolved through the scale subresource of the pods'
controller, and KubeRay's RayCluster has none (its CRD declares only `status`): the disruption
controller finds no scale for the pods (kubernetes pkg/controller/disruption/disruption.go,
getExpectedPodCount -> getExpectedScale: "found no controllers for pod" / the finders return no
scale), reports the PDB with 0 disruptions allowed, and every node drain blocks forever. An integer
`minAvailable` is counted against the selected pods themselves (getExpectedPodCount: "minAvailable is
an int ... expectedCount = len(pods)"), so it works for any owner.

`pdops render` emits this form (manifest.render) and the Kubernetes target applies it unchanged
(targets/kube/objects.py only renames each PDB per colour and narrows its selector to the colour),
so a render applied with kubectl, Argo CD or Flux behaves as the target's.
"""
from __future__ import annotations

from typing import Any

GROUP_LABEL = "ray.io/group"


def group_pods(rayservice: dict[str, Any]) -> dict[str, int]:
    """Worker group -> pods it keeps (max(replicas, minReplicas) x numOfHosts)."""
    groups = ((rayservice.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
    return {g["groupName"]: max(int(g.get("replicas") or 0), int(g.get("minReplicas") or 0))
            * int(g.get("numOfHosts", 1)) for g in groups}


def as_min_available(pdb: dict[str, Any], pods: dict[str, int]) -> str | None:
    """Rewrite `maxUnavailable: N` over one worker group into `minAvailable: pods - N`, in place.
    Returns what is wrong when it cannot be (None: done, or nothing to do)."""
    spec = pdb.get("spec") or {}
    if "maxUnavailable" not in spec:
        return None
    group = ((spec.get("selector") or {}).get("matchLabels") or {}).get(GROUP_LABEL)
    unavailable = spec["maxUnavailable"]
    if group not in pods or not isinstance(unavailable, int) or isinstance(unavailable, bool):
        return (f"maxUnavailable {unavailable!r} on pods of "
                f"{'group ' + group if group else 'no single worker group'} cannot work for KubeRay pods: the "
                "disruption controller needs a scale subresource for maxUnavailable and percentages, and RayCluster "
                f"has none; select one worker group ({GROUP_LABEL}) with an integer maxUnavailable, or use an "
                "integer minAvailable")
    del spec["maxUnavailable"]
    spec["minAvailable"] = max(0, pods[group] - unavailable)
    return None
