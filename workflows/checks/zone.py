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
from workflows.render.rendered import RenderedRelease
from workflows.render.serve_config import PHASES
from workflows.spec.instance_types import ZONE_LABEL, allowed_values, pod_spec

FIX = (f"pin both worker groups to one zone: nodeSelector {{{ZONE_LABEL}: <zone>}} (or required node affinity "
       f"{ZONE_LABEL} In [<zone>]) in the overlay's node-groups patch")


def zone(v: RenderedRelease) -> Iterator[Finding]:
    if v.is_cpu:
        return
    groups, zones = v.groups, {}
    for name in PHASES:
        if name not in groups:
            continue   # the placement rule reports a missing group
        group = groups[name]
        allowed = allowed_values(pod_spec(group.raw), ZONE_LABEL)
        field = group.path + ".template.spec.nodeSelector"
        # A replica that spans nodes (pipeline stages on several pods) passes activations between its own
        # nodes every step, over EFA: its pods need one zone even apart from the KV hop.
        nodes = v.phases[name].nodes_per_replica
        stages = (f"; each {name} replica's pipeline stages span {nodes} nodes, which would also cross zones"
                  if nodes > 1 else "")
        if allowed is None:
            yield Finding("zone", f"{name} pods can land in any availability zone: KV over EFA does not cross zones"
                          + stages, v.kustomization_file, field, FIX)
        elif len(allowed) != 1:
            what = ", ".join(sorted(allowed)) if allowed else "no zone (nodeSelector and affinity disagree)"
            yield Finding("zone", f"{name} pods can land in {what}: prefill and decode must share one zone" + stages,
                          v.kustomization_file, field, FIX)
        else:
            zones[name] = (group.path, next(iter(allowed)))
    if len(zones) == 2 and zones["prefill"][1] != zones["decode"][1]:
        yield Finding("zone", f"prefill is pinned to {zones['prefill'][1]} but decode to {zones['decode'][1]}: "
                      "KV over EFA does not cross availability zones", v.kustomization_file,
                      zones["decode"][0] + ".template.spec.nodeSelector", FIX)


RULES = [zone]
