"""One lock per run (issue 22 item 4): `pdops run start` takes the environment's Lease for the run, its
writing steps hold it ($PDOPS_RUN_ID; KubernetesTarget.session renews it, or fails naming the holder),
`pdops run end` releases it. On the test cluster (tests/fakes/kube): two concurrent runs on one
environment never interleave writes, and a second run waits, or fails naming the holder."""
from __future__ import annotations

import threading

import pytest

from tests.kube_support import LOCAL_NS, Lines, record, release, target
from workflows.cli.main import main
from workflows.names import LOCK_NAME
from workflows.targets.base import TargetError


def _holder(cluster) -> str | None:
    lease = cluster.objects("leases", LOCAL_NS).get(LOCK_NAME)
    return lease["spec"]["holderIdentity"] if lease and not lease["metadata"].get("deletionTimestamp") else None


def _run(cluster, action: str, run_id: str, *extra: str) -> int:
    return main(["run", action, "--run-id", run_id, "--namespace", LOCAL_NS, "--kubeconfig", str(cluster.kubeconfig),
                 *extra])


def test_a_second_run_fails_naming_the_holder_and_its_steps_write_nothing(cluster, manifests, capsys):
    release(target(cluster), record(manifests, variant="a"))
    assert _run(cluster, "start", "A") == 0 and _holder(cluster) == "run A"
    capsys.readouterr()
    assert _run(cluster, "start", "B", "--wait", "0.5") == 1
    assert "holder: run A" in capsys.readouterr().err

    # a step of run B (which never took the lock) writes nothing and names the holder
    before = len([r for r in cluster.api.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")])
    b = target(cluster, run_id="B")
    with pytest.raises(TargetError) as refused:
        with b.session():
            b.apply(record(manifests, variant="b"), Lines())
    assert "run B does not hold the release lock" in refused.value.problem
    assert "holder: run A" in refused.value.render()
    assert len([r for r in cluster.api.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]) == before

    # run A's steps hold it: each renews it while it writes, and leaves it held for the next step
    a = target(cluster, run_id="A")
    with a.session():
        a.apply(record(manifests, variant="c"), Lines())
    assert _holder(cluster) == "run A"
    assert _run(cluster, "end", "B") == 0 and _holder(cluster) == "run A"   # not B's to release
    assert _run(cluster, "end", "A") == 0 and _holder(cluster) is None
    assert _run(cluster, "start", "B", "--wait", "0.5") == 0 and _holder(cluster) == "run B"


def test_two_concurrent_runs_on_one_environment_never_interleave_writes(cluster, manifests):
    """Each run: start (waits for the other), rollout step, wait step, rollback step, end; every step a
    fresh target (as a fresh pod) holding the run's Lease. The runs' writes (by user agent) form two
    blocks, never interleaved."""
    from workflows.targets.kubernetes import KubernetesTarget

    release(target(cluster), record(manifests, variant="a"))
    errors: list[BaseException] = []

    def step(run_id: str):
        return KubernetesTarget(LOCAL_NS, api_client=cluster.client(f"run-{run_id}"), poll_s=0.05,
                                restore_timeout_s=30, drain_grace_s=0.1, run_id=run_id)

    def run(run_id: str, variant: str) -> None:
        try:
            assert _run(cluster, "start", run_id, "--wait", "120") == 0
            t = step(run_id)
            with t.session():
                t.apply(record(manifests, variant=variant), Lines())
            t = step(run_id)
            with t.session():
                t.wait_ready(30, Lines())
            t = step(run_id)
            with t.session():
                t.rollback(["test"], None, Lines())
            assert _run(cluster, "end", run_id) == 0
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r, v)) for r, v in (("A", "x"), ("B", "y"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert errors == []
    order = [r.agent.removeprefix("run-") for r in cluster.api.requests
             if r.method in ("POST", "PUT", "PATCH", "DELETE") and r.agent.startswith("run-")
             and "/leases" not in r.path]
    assert set(order) == {"A", "B"}
    first = order[0]
    switches = sum(1 for x, y in zip(order, order[1:], strict=False) if x != y)
    assert switches == 1, order          # AAAA...BBBB: one run's writes, then the other's
    assert order.count(first) > 2
    assert _holder(cluster) is None
