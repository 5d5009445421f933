"""A small scheduler for the test cluster: binds a pod to the first node it fits, or leaves it Pending with
kube-scheduler's message ("0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) didn't
match Pod's node affinity/selector."). Fit is NodeResourcesFit's rule: for each requested resource,
allocatable minus the requests of pods bound to the node (not Succeeded/Failed) covers it; requests
default to limits. Written independently of the target's capacity check, which it tests.
"""
from __future__ import annotations

from collections import Counter
from decimal import Decimal

from kubernetes.utils import parse_quantity

from tests.fakes.kube.store import BY_KIND, Store

NODE, POD = BY_KIND["Node"], BY_KIND["Pod"]


def requests(spec: dict) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[k] = out.get(k, Decimal(0)) + parse_quantity(v)
    return out


def schedule(store: Store, pod: dict) -> tuple[str | None, str]:
    """(node name, "") or (None, why not)."""
    nodes = store.list(NODE, None)[0]
    pods = store.list(POD, None)[0]
    want = requests(pod.get("spec") or {})
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    reasons: Counter[str] = Counter()
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        ready = all(c.get("status") == "True" for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready")
        if (node.get("spec") or {}).get("unschedulable") or not ready:
            reasons["node(s) were unschedulable"] += 1
            continue
        if any(labels.get(k) != v for k, v in selector.items()):
            reasons["node(s) didn't match Pod's node affinity/selector"] += 1
            continue
        free = {k: parse_quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        for other in pods:
            if (other.get("spec") or {}).get("nodeName") == node["metadata"]["name"] and \
                    (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for k, v in requests(other["spec"]).items():
                    free[k] = free.get(k, Decimal(0)) - v
        short = [k for k, v in want.items() if v > 0 and free.get(k, Decimal(0)) < v]
        if not short:
            return node["metadata"]["name"], ""
        reasons[f"Insufficient {short[0]}"] += 1
    text = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {text or 'no nodes'}."
