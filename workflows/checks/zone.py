"""Placement: prefill and decode nodes in one availability zone.

KV moves from prefill to decode over EFA, and EFA traffic does not cross availability zones (AWS
EFA user guide; notes/pd-on-eks.md); over TCP a cross-zone hop adds latency and is billed per GB.
So a GPU release must pin each phase to one zone, the same zone, with the node label
topology.kubernetes.io/zone in nodeSelector or required node affinity. CPU (local) releases are
not placed by Kubernetes zones and are skipped.
"""
from __future__ import annotations

from collections.abc import Iterator

from workflows.checks.findings import Finding
from workflows.checks.rules import _group_path, _groups, _nodes_per_replica, _phase, rule
from workflows.instances import ZONE_LABEL, allowed_values, pod_spec
from workflows.manifest import Rendered
from workflows.serve_config import PHASES

FIX = (f"pin both worker groups to one zone: nodeSelector {{{ZONE_LABEL}: <zone>}} (or required node affinity "
       f"{ZONE_LABEL} In [<zone>]) in the overlay's node-groups patch")


def _is_cpu(r: Rendered) -> bool:
    return any((_phase(r, n).get("accelerator_config") or {}).get("kind") == "cpu" for n in PHASES)


@rule
def zone(r: Rendered) -> Iterator[Finding]:
    if _is_cpu(r):
        return
    groups, zones = _groups(r), {}
    for name in PHASES:
        if name not in groups:
            continue   # the placement rule reports a missing group
        index, group = groups[name]
        allowed = allowed_values(pod_spec(group), ZONE_LABEL)
        field = _group_path(r, index) + ".template.spec.nodeSelector"
        # A replica that spans nodes (pipeline stages on several pods) passes activations between its own
        # nodes every step, over EFA: its pods need one zone even apart from the KV hop.
        nodes = _nodes_per_replica(r, name)
        stages = (f"; each {name} replica's pipeline stages span {nodes} nodes, which would also cross zones"
                  if nodes > 1 else "")
        if allowed is None:
            yield Finding("zone", f"{name} pods can land in any availability zone: KV over EFA does not cross zones"
                          + stages, r.kustomization_file(), field, FIX)
        elif len(allowed) != 1:
            what = ", ".join(sorted(allowed)) if allowed else "no zone (nodeSelector and affinity disagree)"
            yield Finding("zone", f"{name} pods can land in {what}: prefill and decode must share one zone" + stages,
                          r.kustomization_file(), field, FIX)
        else:
            zones[name] = (index, next(iter(allowed)))
    if len(zones) == 2 and zones["prefill"][1] != zones["decode"][1]:
        yield Finding("zone", f"prefill is pinned to {zones['prefill'][1]} but decode to {zones['decode'][1]}: "
                      "KV over EFA does not cross availability zones", r.kustomization_file(),
                      _group_path(r, zones["decode"][0]) + ".template.spec.nodeSelector", FIX)
