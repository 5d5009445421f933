"""The capacity check against the test cluster's nodes and pods (dev overlay: each prefill and decode
worker pod asks for 4 GPUs, 40 CPU and 300 GiB on one g6e.12xlarge node; the head 4 CPU on a
`role: system` node). The fake scheduler (tests/fakes/kube/scheduler.py) is the referee: what the
check lets through, it schedules; what the check refuses, it leaves Pending."""
from __future__ import annotations

import pytest
from kubernetes import client

from tests.kube_support import DEV_NS, Lines, eventually, gpu_nodes, live, node, record, release, system_node, target
from workflows.targets.base import TargetError


def _pending(cluster) -> list[str]:
    return sorted(n for n, p in cluster.objects("pods", DEV_NS).items() if (p.get("status") or {}).get("phase") == "Pending")


def test_a_candidate_that_fits_beside_stable_is_applied_and_one_that_does_not_is_refused(cluster, manifests):
    for n in gpu_nodes(1):
        cluster.add_node(n)
    t, progress = target(cluster, DEV_NS), Lines()
    release(t, record(manifests, "dev", "a"), progress)  # one node per phase: the first colour fits
    assert any(line.startswith("[capacity] prefill pod 1/1 -> prefill-1") for line in progress)
    history_before = cluster.objects("configmaps", DEV_NS)

    with pytest.raises(TargetError) as refused:
        t.apply(record(manifests, "dev", "b"), Lines())
    text = refused.value.render()
    assert "the candidate pd-llm-green does not fit" in text
    assert "prefill pod 1/1 (cpu=40, memory=300Gi, nvidia.com/gpu=4" in text and "prefill-1: cpu=8, memory=84Gi, nvidia.com/gpu=0" in text
    assert set(live(cluster, "rayservices", DEV_NS)) == {"pd-llm-blue"}
    assert cluster.objects("configmaps", DEV_NS) == history_before  # refused before anything was written

    for n in (node("prefill-2", "prefill", 4), node("decode-2", "decode", 4)):
        cluster.add_node(n)
    assert t.apply(record(manifests, "dev", "b"), Lines()).colour == "green"
    t.wait_ready(30, Lines())
    assert _pending(cluster) == []


def _two_gpus_each(cluster) -> None:
    """4 GPUs per phase in total, but 2 per node: no 4-GPU pod fits (GPUs are not summed across nodes)."""
    cluster.add_node(system_node())
    for phase in ("prefill", "decode"):
        for i in (1, 2):
            cluster.add_node(node(f"{phase}-{i}", phase, 2))


def _taken_by_another_namespace(cluster) -> None:
    """Another team's pod holds 2 of each node's 4 GPUs."""
    for n in gpu_nodes(1):
        cluster.add_node(n)
    for phase in ("prefill", "decode"):
        client.CoreV1Api(cluster.client("other-team")).create_namespaced_pod("default", {
            "metadata": {"name": f"training-{phase}"}, "spec": {"nodeName": f"{phase}-1", "containers": [
                {"name": "t", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}]}},
            _preload_content=False)


def _short_of_memory(cluster) -> None:
    """Enough GPUs, not enough memory (300 GiB asked, 256 GiB allocatable)."""
    cluster.add_node(system_node())
    for phase in ("prefill", "decode"):
        cluster.add_node(node(f"{phase}-1", phase, 4, memory="256Gi"))


def _efa_missing(cluster, manifests) -> None:
    cluster.add_node(system_node())
    for phase in ("prefill", "decode"):
        cluster.add_node(node(f"{phase}-1", phase, 4))


@pytest.mark.parametrize("nodes, short", [(_two_gpus_each, "nvidia.com/gpu=2"), (_taken_by_another_namespace, "nvidia.com/gpu=2"),
                                          (_short_of_memory, "memory=256Gi")])
def test_a_candidate_the_scheduler_cannot_place_is_refused(cluster, manifests, nodes, short):
    nodes(cluster)
    with pytest.raises(TargetError) as refused:
        target(cluster, DEV_NS).apply(record(manifests, "dev"), Lines())
    assert "fits on no node" in refused.value.render() and short in refused.value.render()
    assert live(cluster, "rayservices", DEV_NS) == {}
    # the referee: applied anyway, its pods stay Pending
    target(cluster, DEV_NS, capacity_check=False).apply(record(manifests, "dev"), Lines())
    assert eventually(lambda: any("worker" in n for n in _pending(cluster)))


def test_efa_devices_are_counted(cluster, manifests):
    def with_efa(objects):
        rs = next(o for o in objects if o["kind"] == "RayService")
        for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            res = g["template"]["spec"]["containers"][0]["resources"]
            res["requests"]["vpc.amazonaws.com/efa"] = res["limits"]["vpc.amazonaws.com/efa"] = "1"
    _efa_missing(cluster, manifests)
    with pytest.raises(TargetError) as refused:
        target(cluster, DEV_NS).apply(record(manifests, "dev", edit=with_efa), Lines())
    assert "vpc.amazonaws.com/efa=1" in refused.value.render()


def test_terminating_pods_are_not_counted_and_said_so(cluster, manifests):
    """Issue 22 item 6: a terminating pod (deletionTimestamp set: the colour a promote retired, a deleted
    reference) frees its GPUs once gone; counting it refused a rollout that fits seconds later. It is
    not counted, and the progress names it (the new pods are scheduled when it is gone)."""
    for n in gpu_nodes(1):
        cluster.add_node(n)
    core = client.CoreV1Api(cluster.client("other-team"))
    core.create_namespaced_pod("default", {"metadata": {"name": "old", "finalizers": ["example.com/wait"]}, "spec": {
        "nodeName": "prefill-1", "containers": [{"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
        _preload_content=False)
    core.delete_namespaced_pod("old", "default")
    assert cluster.objects("pods", "default")["old"]["metadata"]["deletionTimestamp"]
    progress = Lines()
    target(cluster, DEV_NS).apply(record(manifests, "dev"), progress)
    assert any("not counted: 1 terminating pod(s) (default/old)" in line for line in progress), progress
    assert set(live(cluster, "rayservices", DEV_NS)) == {"pd-llm-blue"}


def test_capacity_check_degrades_when_nodes_are_forbidden(cluster, manifests):
    cluster.faults.forbidden = {"nodes"}
    progress = Lines()
    target(cluster, DEV_NS).apply(record(manifests, "dev"), progress)
    assert any("skipped: listing nodes and pods cluster-wide is forbidden" in line and "pdops-node-reader" in line for line in progress)
    assert set(live(cluster, "rayservices", DEV_NS)) == {"pd-llm-blue"}


def test_without_the_node_reader_an_unschedulable_reference_fails_fast_with_the_fix(cluster, manifests):
    """Issue 22 item 6: the capacity check is forbidden (no pdops-node-reader ClusterRole), so nothing checked
    that the reference's decode pod fits; once the scheduler calls it Unschedulable the reference is
    skipped at once with the fix, not after reference_timeout_s (1800 s by default) of Pending."""
    import time

    for n in gpu_nodes(1):
        cluster.add_node(n)
    t = target(cluster, DEV_NS, reference_timeout_s=600)
    rec = record(manifests, "dev")
    release(t, rec)
    # the only decode node serves the stable release: the reference's decode pod has no room
    cluster.faults.forbidden = {"nodes"}
    progress = Lines()
    started = time.monotonic()
    with t.reference_server(t.status().stable.release, progress) as url:
        took = time.monotonic() - started
    assert not isinstance(url, str), progress
    assert "Unschedulable" in url.reason and "pdops-node-reader" in url.reason, url
    assert took < 60, took
