"""Instance facts: what each worker group asks of a node against what its instance type offers.

The instance type is read from the group's node.kubernetes.io/instance-type pin (nodeSelector or
required node affinity) and looked up in the pinned table (workflows/data/instance_types.yaml).
A pod "takes the node" when its CPU or memory request is over half the instance's, so no second
such pod fits: then every GPU of the node is paid for and must be requested.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from workflows.checks.findings import Finding
from workflows.render.rendered import EFA, GPU, RenderedRelease, WorkerGroup, serve_path
from workflows.render.serve_config import PHASES
from workflows.render.sizing import GIB
from workflows.spec.instance_types import (
    HOSTNAME_LABEL,
    InstanceType,
    allowed_values,
    instance_types_of,
    pod_spec,
    table,
)

_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def quantity(value: Any) -> float:
    """A Kubernetes resource quantity ("180", "500m", "1800Gi") as a number; ValueError otherwise."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"not a resource quantity: {value!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


def _request(group: WorkerGroup, resource: str) -> float:
    total = 0.0
    for c in pod_spec(group.raw).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        total += quantity(value) if value is not None else 0.0
    return total


def takes_node(group: WorkerGroup, it: InstanceType) -> bool:
    return _request(group, "cpu") > it.vcpu / 2 or _request(group, "memory") > it.memory_gib * GIB / 2


def phase_instances(v: RenderedRelease) -> dict[str, tuple[WorkerGroup, str, InstanceType | None]]:
    """Each phase -> (group, instance type name, its facts or None) for a pinned single type."""
    out = {}
    for name in PHASES:
        if name in v.groups:
            group = v.groups[name]
            types = instance_types_of(group.raw)
            if types and len(types) == 1:
                it = next(iter(types))
                out[name] = (group, it, table().get(it))
    return out


def instance_facts(v: RenderedRelease) -> Iterator[Finding]:
    if v.is_cpu:
        return
    kfile, pinned = v.kustomization_file, phase_instances(v)
    for name in PHASES:
        if name not in v.groups:
            continue
        group = v.groups[name]
        path = group.path
        if name not in pinned:
            yield Finding("instance-type", f"{name} pods are not pinned to one instance type: GPU, EFA and memory "
                          "cannot be checked against the node", kfile, path + ".template.spec.nodeSelector",
                          "set nodeSelector node.kubernetes.io/instance-type in the overlay's node-groups patch",
                          severity="warning")
            continue
        _, it_name, it = pinned[name]
        if it is None:
            yield Finding("instance-type", f"{it_name} is not in the pinned instance table", kfile,
                          path + ".template.spec.nodeSelector",
                          "add it to workflows/data/instance_types.yaml with its source", severity="warning")
            continue
        yield from _fits(v, name, path, group, it_name, it)


def _fits(v: RenderedRelease, name: str, path: str, group: WorkerGroup, it_name: str,
          it: InstanceType) -> Iterator[Finding]:
    kfile, limits = v.kustomization_file, path + ".template.spec.containers[0].resources"
    gpus, efa, tp = group.limit(GPU), group.limit(EFA), v.phases[name].tp
    for res, want, have, unit in (("cpu", _request(group, "cpu"), it.vcpu, "vCPU"),
                                  ("memory", _request(group, "memory") / GIB, it.memory_gib, "GiB")):
        if want >= have:   # allocatable is below capacity: kubelet and the system reserve part of it
            yield Finding("instance-capacity", f"{name} requests {want:g} {unit} {res} but a {it_name} has {have:g} "
                          "(and less allocatable): the pod never schedules", kfile, f"{limits}.requests.{res}",
                          f"request less than the node's allocatable {res}")
    if gpus > it.gpus:
        yield Finding("instance-gpus", f"{name} requests {gpus:g} GPUs but a {it_name} has {it.gpus}",
                      kfile, f"{limits}.limits.{GPU}", f"request at most {it.gpus} GPUs or pick a larger instance type")
    elif gpus and gpus < it.gpus and takes_node(group, it):
        yield Finding("instance-gpus", f"{name} pods take a whole {it_name} (cpu/memory requests over half the node) "
                      f"but request {gpus:g} of its {it.gpus} GPUs: {it.gpus - gpus:g} GPUs per node are paid for "
                      "and idle", kfile, f"{limits}.limits.{GPU}", f"request {it.gpus} GPUs, or smaller cpu/memory")
    if gpus and tp and gpus % tp:
        yield Finding("tp-divides", f"{name} tensor_parallel_size {tp} does not divide the pod's {gpus:g} GPUs: "
                      f"{gpus % tp:g} GPUs per pod can never hold a replica", v.serve_file,
                      serve_path(name, "engine_kwargs.tensor_parallel_size"),
                      f"use a TP that divides {gpus:g}, or change the pod's GPU count")
    if efa and not it.efa:
        yield Finding("efa-capable", f"{name} requests {EFA} but {it_name} does not support EFA", kfile,
                      f"{limits}.limits.{EFA}", "drop the efa component or pick an EFA-capable instance type")
    elif efa > it.efa:
        yield Finding("instance-efa", f"{name} requests {efa:g} EFA interfaces but a {it_name} has {it.efa}", kfile,
                      f"{limits}.limits.{EFA}", f"request {it.efa} (patch the efa component's count in the overlay)")
    accel = v.phases[name].config.get("accelerator_type")
    if accel and not it.accepts(str(accel)):
        yield Finding("accelerator-type", f"release.yaml says accelerator {accel} but {it_name} has "
                      f"{it.gpu}: Ray never finds a node with that accelerator and the phase stays pending",
                      v.serve_file, serve_path(name, "accelerator_type"),
                      f"set accelerator.type: {it.gpu} (or pin the instance type that has {accel})")


def _disjoint_nodes(pods: list[dict[str, Any]]) -> bool:
    """True when some node label pins the two pods to disjoint value sets (they never share a node)."""
    keys = set().union(*((p.get("nodeSelector") or {}).keys() for p in pods))
    for expr_pod in pods:
        for term in ((((expr_pod.get("affinity") or {}).get("nodeAffinity") or {})
                      .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []):
            keys |= {e.get("key") for e in (term or {}).get("matchExpressions") or []}
    for key in keys - {None}:
        a, b = (allowed_values(p, key) for p in pods)
        if a is not None and b is not None and not a & b:
            return True
    return False


def _anti_affine(pod: dict[str, Any]) -> bool:
    terms = ((pod.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return any((t or {}).get("topologyKey") == HOSTNAME_LABEL for t in terms)


def pd_same_node(v: RenderedRelease) -> Iterator[Finding]:
    groups = v.groups
    if v.is_cpu or not all(n in groups for n in PHASES):
        return
    pg, dg = groups["prefill"], groups["decode"]
    if not (pg.limit(EFA) or dg.limit(EFA)):
        return
    pods = [pg.pod, dg.pod]
    pinned = phase_instances(v)
    its = [pinned[n][2] if n in pinned else None for n in PHASES]
    if its[0] is not None and its[0] is its[1] and (pg.limit(GPU) + dg.limit(GPU) > its[0].gpus
                                                    or pg.limit(EFA) + dg.limit(EFA) > its[0].efa):
        return   # one pod of each cannot fit on one node together
    if _disjoint_nodes(pods) or any(_anti_affine(p) for p in pods):
        return
    yield Finding("pd-same-node", "prefill and decode pods can be packed on one node while using EFA: they then "
                  "share the node's EFA devices and PCIe, and a node loss takes both phases", v.kustomization_file,
                  dg.path + ".template.spec.nodeSelector",
                  "give each phase its own node group (nodeSelector pdops.dev/phase: prefill / decode, "
                  "as the overlays do)")


RULES = [instance_facts, pd_same_node]
