"""The release lock on the test cluster: the Lease is written only with the resourceVersion last read
(409 = lost), expiry is judged on our own clock, a lost lock stops the release's writes, and the
Lease is deleted on exit only while it is still ours (client-go tools/leaderelection semantics)."""
from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.kube_support import LOCAL_NS, Lines, eventually, record, target
from workflows.targets.base import TargetError

LEASE = "pdops-release"


def _leases(cluster):
    return cluster.objects("leases", LOCAL_NS)


def _custom(cluster, agent="someone-else"):
    return client.CustomObjectsApi(cluster.client(agent))


def test_a_live_holder_keeps_the_lock_and_the_lease_goes_with_it(cluster):
    first, second = target(cluster), target(cluster)
    with first.session():
        lease = _leases(cluster)[LEASE]
        assert lease["spec"]["leaseDurationSeconds"] == 2 and "pid" in lease["spec"]["holderIdentity"]
        with pytest.raises(TargetError) as busy:
            with second.session():
                pass
        assert "another release is running in namespace pdops-local" in busy.value.problem
        assert "renewed the lock while we watched" in busy.value.render()
    assert _leases(cluster) == {}
    with target(cluster, dry_run=True).session():
        assert _leases(cluster) == {}


def test_a_dead_holders_lock_is_taken_after_its_duration_on_our_clock_whatever_its_renew_time_says(cluster):
    future = "2099-01-01T00:00:00.000000Z"  # another host's clock far ahead: comparing with it would never expire
    _custom(cluster).create_namespaced_custom_object("coordination.k8s.io", "v1", LOCAL_NS, "leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE},
        "spec": {"holderIdentity": "dead-pod pid 1", "leaseDurationSeconds": 1, "renewTime": future, "acquireTime": future}})
    started = time.monotonic()
    with target(cluster).session():
        lease = _leases(cluster)[LEASE]
        assert lease["spec"]["holderIdentity"] != "dead-pod pid 1" and lease["spec"]["leaseTransitions"] == 1
    assert time.monotonic() - started >= 1.0


def test_a_takeover_racing_another_writer_loses_on_the_resource_version(cluster):
    """Between our read and our write someone else takes the expired Lease: our write must fail (409), not overwrite."""
    _custom(cluster).create_namespaced_custom_object("coordination.k8s.io", "v1", LOCAL_NS, "leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE},
        "spec": {"holderIdentity": "dead-pod pid 1", "leaseDurationSeconds": 1}})
    raced = []

    def other_writer_first(request):
        if request.method == "PUT" and "/leases/" in request.path and request.agent == "pdops-test" and not raced:
            raced.append(True)
            leases = cluster.store_resource("leases")  # the store directly: this runs inside the API server
            lease = cluster.store.get(leases, LOCAL_NS, LEASE)
            lease["spec"]["holderIdentity"] = "fast-pod pid 2"
            cluster.store.update(leases, LOCAL_NS, LEASE, lease, "other")
    cluster.faults.before_write.append(other_writer_first)
    with pytest.raises(TargetError) as busy:
        with target(cluster).session():
            pass
    assert raced and "fast-pod pid 2" in busy.value.render()
    assert _leases(cluster)[LEASE]["spec"]["holderIdentity"] == "fast-pod pid 2"


def test_losing_the_lock_stops_the_release_and_leaves_the_new_holders_lease(cluster, manifests):
    t = target(cluster)
    with pytest.raises(TargetError) as lost:
        with t.session():
            lease = _leases(cluster)[LEASE]  # a paused holder: someone takes the lock over meanwhile
            lease["spec"]["holderIdentity"] = "taker pid 3"
            _custom(cluster).replace_namespaced_custom_object("coordination.k8s.io", "v1", LOCAL_NS, "leases", LEASE, lease)
            eventually(lambda: t._lock._lost, 10)
            t.apply(record(manifests), Lines())
    assert "the release lock was lost" in lost.value.problem and "taker pid 3" in lost.value.problem
    assert cluster.objects("rayservices", LOCAL_NS) == {} and "pdops-history-pd-llm" not in cluster.objects("configmaps", LOCAL_NS)
    assert _leases(cluster)[LEASE]["spec"]["holderIdentity"] == "taker pid 3"  # not deleted by the loser
