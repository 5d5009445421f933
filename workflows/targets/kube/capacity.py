"""Will the candidate's pods fit? Node by node, as the scheduler's NodeResourcesFit filter decides it.

A pod fits a node when, for every resource it requests, the node's allocatable minus the requests of the
pods already bound there (any namespace; Succeeded/Failed ones do not hold resources) covers it, its
nodeSelector matches the node's labels, and the node is Ready, schedulable and has no
NoSchedule/NoExecute taint the pod does not tolerate. Each pod needs all its GPUs (and EFA devices) on
ONE node, so GPUs are never summed across nodes. A container's requests default to its limits (the API
server's defaulting). Terminating pods (a retired colour, a deleted reference) are not counted, unlike
kube-scheduler, which counts them until they are gone: they free their node within the drain and grace
period, so the candidate's pods are scheduled then rather than never; `place` names them so the wait is
explained. Pods are placed biggest first, first fit; the check says which pod found no node and what
each candidate node has left.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, NamedTuple

from kubernetes.utils import parse_quantity

GPU = "nvidia.com/gpu"
RESOURCES = ("cpu", "memory", GPU, "vpc.amazonaws.com/efa", "pods")


class PodNeed(NamedTuple):
    name: str                          # e.g. "prefill worker 1/2"
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    requests: dict[str, Decimal]


def _requests(spec: dict[str, Any]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {"pods": Decimal(1)}
    for container in spec.get("containers") or []:
        res = container.get("resources") or {}
        for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[name] = out.get(name, Decimal(0)) + parse_quantity(value)
    for container in spec.get("initContainers") or []:  # init containers run one at a time: their max counts
        res = container.get("resources") or {}
        for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[name] = max(out.get(name, Decimal(0)), parse_quantity(value))
    return out


def rayservice_pods(rayservice: dict[str, Any]) -> list[PodNeed]:
    """The pods KubeRay will create for a RayService: one head, replicas x numOfHosts per worker group."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"], 1)] + [
        (g["groupName"], g,
         max(int(g.get("replicas") or 0), int(g.get("minReplicas") or 0)) * int(g.get("numOfHosts", 1)))
        for g in cluster.get("workerGroupSpecs") or []]
    out = []
    for name, group, count in groups:
        spec = (group.get("template") or {}).get("spec") or {}
        for i in range(count):
            out.append(PodNeed(f"{name} pod {i + 1}/{count}", dict(spec.get("nodeSelector") or {}),
                               list(spec.get("tolerations") or []), _requests(spec)))
    return out


def _schedulable(node: dict[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def _tolerates(pod: PodNeed, node: dict[str, Any]) -> bool:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any((t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")))
                   or (t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""))
                   for t in pod.tolerations if t.get("effect") in (None, "", taint.get("effect"))):
            return False
    return True


def free_by_node(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, dict[str, Decimal]]:
    """Allocatable minus what bound, not finished, not terminating pods request, per schedulable node."""
    free = {n["metadata"]["name"]: {r: parse_quantity(v)
                                    for r, v in ((n.get("status") or {}).get("allocatable") or {}).items()}
            for n in nodes if _schedulable(n)}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        # terminating pods (deletionTimestamp set: a retired colour, a deleted reference) free their node soon:
        # the pods waiting for them are scheduled then, so they do not count against what fits
        if (node not in free or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                or (pod.get("metadata") or {}).get("deletionTimestamp")):
            continue
        for name, value in _requests(pod.get("spec") or {}).items():
            free[node][name] = free[node].get(name, Decimal(0)) - value
    return free


def _fmt(res: dict[str, Decimal]) -> str:
    def one(r: str, v: Decimal) -> str:
        return f"{r}={v / 2**30:.0f}Gi" if r == "memory" else f"{r}={v.normalize():f}"
    return ", ".join(one(r, res.get(r, Decimal(0))) for r in RESOURCES if r != "pods")


def place(wanted: list[PodNeed], nodes: list[dict[str, Any]],
          pods: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(where each pod goes, what did not fit) for `wanted` on the nodes' free resources."""
    free = free_by_node(nodes, pods)
    labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in nodes}
    by_name = {n["metadata"]["name"]: n for n in nodes}
    placed, short = [], []
    for pod in sorted(wanted, key=lambda p: (-p.requests.get(GPU, 0), -p.requests.get("cpu", 0))):
        fits = [n for n in sorted(free) if all(labels[n].get(k) == v for k, v in pod.node_selector.items())
                and _tolerates(pod, by_name[n])]
        node = next((n for n in fits
                     if all(free[n].get(r, Decimal(0)) >= v for r, v in pod.requests.items() if v > 0)), None)
        need = _fmt(pod.requests)
        if node is None:
            where = ("; ".join(f"{n}: {_fmt(free[n])} free" for n in fits)
                     or "no schedulable node matches its nodeSelector")
            short.append(f"{pod.name} ({need}; nodeSelector {pod.node_selector or '{}'}) fits on no node — {where}")
            continue
        for r, v in pod.requests.items():
            free[node][r] = free[node].get(r, Decimal(0)) - v
        placed.append(f"{pod.name} -> {node}")
    leaving = sorted(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods
                     if (p.get("metadata") or {}).get("deletionTimestamp") and (p.get("spec") or {}).get("nodeName"))
    if leaving:   # kube-scheduler still counts them until they are gone: the pods above wait for that
        placed.append(f"not counted: {len(leaving)} terminating pod(s) ({', '.join(leaving[:5])}): their resources "
                      "are free once they are gone, and the new pods are scheduled then")
    return placed, short
