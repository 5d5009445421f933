"""Pinned EC2 instance facts (workflows/data/instance_types.yaml) and which nodes a pod may land on.

The table is data with its sources and date in the file; this module only reads it. The node
label logic follows the Kubernetes API (k8s.io/api core/v1 types.go): a pod's nodeSelector and its
required node affinity must both match; NodeSelector.nodeSelectorTerms "are ORed", the
matchExpressions of one term "are ANDed".
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

DATA = Path(__file__).resolve().parents[1] / "data"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"


class InstanceType(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: str                                   # Ray accelerator type name (ray.util.accelerators)
    accelerator_types: list[str] = []          # other names a spec may use for this GPU
    gpus: PositiveInt
    gpu_memory_gib: float = Field(gt=0)        # per GPU
    efa: int = Field(ge=0)                     # EfaInfo.maximumEfaInterfaces; 0 = no EFA
    vcpu: PositiveInt
    memory_gib: float = Field(gt=0)
    sources: list[str] = []
    note: str | None = None

    def accepts(self, accelerator: str) -> bool:
        return accelerator in (self.accelerator_types or [self.gpu])


@functools.lru_cache(maxsize=1)
def table() -> dict[str, InstanceType]:
    raw = yaml.safe_load((DATA / "instance_types.yaml").read_text(encoding="utf-8"))
    return {name: InstanceType.model_validate(row) for name, row in raw.items()}


def pod_spec(group: dict[str, Any]) -> dict[str, Any]:
    spec = (group.get("template") or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def allowed_values(pod: dict[str, Any], key: str) -> set[str] | None:
    """The values of node label `key` a pod can be scheduled on; None when any value will do."""
    allowed: set[str] | None = None
    selector = pod.get("nodeSelector") or {}
    if key in selector:
        allowed = {str(selector[key])}
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    union: set[str] | None = set() if terms else None
    for term in terms:                        # ORed: a term that leaves `key` free frees it
        values: set[str] | None = None
        for expr in (term or {}).get("matchExpressions") or []:   # ANDed
            if expr.get("key") == key and expr.get("operator") == "In":
                these = {str(v) for v in expr.get("values") or []}
                values = these if values is None else values & these
        if values is None or union is None:   # (union is a set while terms are left)
            union = None
            break
        union |= values
    if union is not None:
        allowed = union if allowed is None else allowed & union
    return allowed


def instance_types_of(group: dict[str, Any]) -> set[str] | None:
    return allowed_values(pod_spec(group), INSTANCE_TYPE_LABEL)
