"""Where validation and users reach a colour, and moving users from one colour to another without cutting them.

Metrics: Ray runs one metrics agent per node (pod) that exports only that node's processes; the
vLLM engines run on the worker pods, so the head's :8080 (and `<rs>-head-svc`) never carries a
`ray_vllm_*` series. A slot's metrics are therefore every worker pod of its colour, each scraped
at `<podIP>:<metrics port>` and tagged with its phase (the pod template's `pdops.dev/phase`, else
the worker group name), in the comma-separated form validation.server_metrics.sources reads.

Drain (promote): after the stable Service selects the new colour, wait until its EndpointSlices
list only pods of that colour (the endpoints controller has caught up), then a grace period for
kube-proxy on every node to follow and for streams still on the old colour to finish, and only
then delete the old colour. Deleting at once cuts in-flight streams.
"""
from __future__ import annotations

import re
import time
from typing import Any

from validation.server_metrics import (
    RAY_METRICS_INTERVAL_ENV,
    RAY_METRICS_LAG_S,
    parse,
    ray_export_lag_s,
    scrape,
    sources,
)
from workflows.names import COLOUR_LABEL, PHASE_LABEL
from workflows.render.pdb import GROUP_LABEL
from workflows.render.rendered import WorkerGroup
from workflows.targets.base import Endpoint, Progress, ReleaseRecord
from workflows.targets.kube import objects as obj
from workflows.targets.kube.api import Kube
from workflows.targets.polling import Poll


def _metrics_port(rayservice: dict[str, Any], group: str) -> int:
    cluster = rayservice["spec"]["rayClusterConfig"]
    spec = next((g for g in cluster.get("workerGroupSpecs") or [] if g.get("groupName") == group),
                cluster["headGroupSpec"])
    containers = (spec.get("template") or {}).get("spec", {}).get("containers") or [{}]
    return next((p["containerPort"] for p in containers[0].get("ports") or [] if p.get("name") == "metrics"), 8080)


def worker_metrics(kube: Kube, record: ReleaseRecord) -> str | None:
    """`http://<podIP>:<port>/metrics#<phase>` of every running worker pod of the record's colour."""
    rayservice = obj.only(record, "RayService")
    pods = kube.list("Pod", {COLOUR_LABEL: record.colour, obj.NODE_TYPE_LABEL: "worker"})
    urls = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        labels, ip = pod["metadata"].get("labels") or {}, (pod.get("status") or {}).get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running":
            continue
        group = labels.get(GROUP_LABEL, "")
        phase = labels.get(PHASE_LABEL) or group
        urls.append(f"http://{ip}:{_metrics_port(rayservice, group)}/metrics#{phase}")
    return ",".join(urls) or None


def engine_replicas(metrics_url: str | None, timeout_s: float = 2.0) -> dict[str, dict[str, list[str]]]:
    """Per phase, the Serve ReplicaIds the worker pods' engines export under (validation compares them
    before and after a run to see engines that were replaced). Empty when the pods cannot be reached
    (a CLI outside the cluster network)."""
    out: dict[str, set[str]] = {}
    for src in sources(metrics_url):
        try:
            samples = parse(scrape(src.url, timeout_s))
        except Exception:  # noqa: BLE001 - unreachable from here: no replica identities, not an error
            return {}
        ids = {dict(labels).get("ReplicaId") for name, labels, _ in samples if name.startswith("ray_vllm")}
        out.setdefault(src.phase or "engine", set()).update(i for i in ids if i)
    return {phase: {"ReplicaId": sorted(ids)} for phase, ids in out.items() if ids}


def prom_label(name: str) -> str:
    """A pod label as the PodMonitor's podTargetLabels put it on every series: prometheus-operator
    (pkg/prometheus/promcfg.go, generatePodMonitorConfig) relabels `__meta_kubernetes_pod_label_<l>`
    to sanitizeLabelName(l), every character outside [a-zA-Z0-9_] made `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def export_lag_s(record: ReleaseRecord) -> float:
    """How stale the engines' metrics of `record` can be: Ray's export lag at the interval its worker
    groups' containers set (RAY_METRICS_INTERVAL_ENV; kustomize/base sets 2 s), the slowest group's, Ray's
    default where a group sets none (a render from before the base set it). Every bench waits this long
    before its window opens and after it closes (validation/bench.py)."""
    groups = obj.only(record, "RayService")["spec"]["rayClusterConfig"].get("workerGroupSpecs") or []
    lags = []
    for i, spec in enumerate(groups):
        value = str(WorkerGroup(spec.get("groupName"), i, spec, "").env.get(RAY_METRICS_INTERVAL_ENV))
        lags.append(ray_export_lag_s(int(value) if value.isdigit() else None))
    return max(lags, default=RAY_METRICS_LAG_S)


def endpoint(kube: Kube, slot: str, record: ReleaseRecord, lag_s: float | None = None) -> Endpoint:
    """`lag_s`: how stale its metrics can be; None: what its render sets (export_lag_s)."""
    lag_s = export_lag_s(record) if lag_s is None else lag_s
    ns = kube.namespace
    metrics = worker_metrics(kube, record)
    phases = engine_replicas(metrics)
    # in Prometheus: this colour's pods (the rendered PodMonitor lists both in podTargetLabels: render/monitor.py)
    prom = {"prometheus_labels": {"namespace": ns, prom_label(COLOUR_LABEL): record.colour},
            "prometheus_phase_label": prom_label(PHASE_LABEL)}
    if slot == "stable":
        service = obj.only(record, "Service")
        port = (service["spec"].get("ports") or [{"port": 8000}])[0]["port"]
        return Endpoint(base_url=f"http://{service['metadata']['name']}.{ns}.svc.cluster.local:{port}/v1",
                        metrics_url=metrics, metrics_phases=phases, metrics_lag_s=lag_s, **prom)
    # KubeRay names a RayService's serve Service <name>-serve-svc (utils.GenerateServeServiceName).
    rayservice = obj.only(record, "RayService")
    containers = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    port = next((p["containerPort"] for p in containers[0].get("ports") or [] if p.get("name") == "serve"), 8000)
    return Endpoint(base_url=f"http://{obj.rs_name(record)}-serve-svc.{ns}.svc.cluster.local:{port}/v1",
                    metrics_url=metrics, metrics_phases=phases, metrics_lag_s=lag_s, **prom)


def endpoint_colours(kube: Kube, service: str) -> tuple[set[str], int]:
    """Colours of the pods behind the Service's ready endpoints, and how many endpoints."""
    slices = kube.list("EndpointSlice", {"kubernetes.io/service-name": service})
    names = {(e.get("targetRef") or {}).get("name") for s in slices for e in s.get("endpoints") or []
             if (e.get("conditions") or {}).get("ready") is not False}
    names.discard(None)
    pods = {p["metadata"]["name"]: p for p in kube.list("Pod", COLOUR_LABEL)}
    return {(pods.get(n, {}).get("metadata", {}).get("labels") or {}).get(COLOUR_LABEL, "?") for n in names}, len(names)


def drain(kube: Kube, service: str, colour: str, grace_s: float, timeout_s: float, poll_s: float,
          progress: Progress) -> bool:
    """Wait until `service` routes to `colour` only, then `grace_s`. False: it never did within `timeout_s`."""
    start, poll = time.monotonic(), Poll(poll_s)
    while True:
        colours, count = endpoint_colours(kube, service)
        if colours == {colour}:
            break
        if time.monotonic() - start >= timeout_s:
            progress(f"[promote] Service {service} still routes to {', '.join(sorted(colours)) or 'no pod'} "
                     f"({count} endpoints) after {timeout_s:.0f}s")
            return False
        poll.sleep()
    progress(f"[promote] Service {service} routes to {colour} only "
             f"({count} endpoints, {time.monotonic() - start:.1f}s); "
             f"{grace_s:.0f}s for streams on the old colour to finish")
    time.sleep(grace_s)
    return True
