"""One lock per run (issue 22 item 4), with the committed pd-release.yaml under two Argo controllers.

Argo's `synchronization.mutexes` lock lives in the memory of one controller (tests/argo/workflow.py
`_mutex`, citing workflow/sync/sync_manager.go), so two controllers (say, two clusters' Argo
releasing one shared environment) run two pd-release of `dev` at the same time. What keeps them
apart is the Lease `pdops-release` in llm-dev: the run's `lock` step takes it (`pdops run start`),
every writing step holds and renews it (KubernetesTarget.session, $PDOPS_RUN_ID), the exit handler's
`unlock` releases it. A second run waits while the Lease is unchanged and fails naming the holder as
soon as it sees it renewed; a run that died without its exit handler leaves a Lease that stops
changing, and the next run takes it over once it has been unchanged for its duration.

Emulated: two controllers (their mutexes their own), workflow deletion (pods garbage-collected, no
exit handler), the API server's write log (tests/fakes/kube/server.py: every request in the order it
was served, with the pod that sent it: each pod's token names it, as a bound ServiceAccount token
does). Real: every step (`pdops ...` processes), the Lease code, the engines validated.
Time is scaled: the run's Lease lasts LEASE_S (PDOPS_RUN_LEASE_S in every pod) instead of
RUN_LEASE_S = 600 s, so a renewal is every LEASE_S / 4 and a dead run's Lease is taken over after LEASE_S.
"""
from __future__ import annotations

import threading
import time

from tests.argo.scenario import NS, PipelineCluster
from tests.argo.workflow import Run
from tests.fakes.kube.server import Request
from workflows.names import LOCK_NAME, RUN_LEASE_ENV
from workflows.targets.kube.lease import RENEW_EVERY, run_holder

LEASE_S = 30.0   # gaps between the steps here are seconds; 30 s keeps every gap well inside the Lease
POD_ENV = {RUN_LEASE_ENV: f"{LEASE_S:g}"}


def _stored(pipeline: PipelineCluster) -> list[Request]:
    return [r for r in list(pipeline.cluster.api.requests) if r.stored]


def _pod(r: Request) -> str:
    return r.user.removeprefix("pod:") if r.user.startswith("pod:") else ""


def _run_of(r: Request) -> str:
    """The workflow a pod belongs to: Argo's node names are <workflow>.<task>[(retry)]."""
    return _pod(r).split(".")[0]


def _is_lease(r: Request) -> bool:
    return f"/namespaces/{NS}/leases" in r.path


def _holder(pipeline: PipelineCluster) -> str | None:
    lease = pipeline.cluster.objects("leases", NS).get(LOCK_NAME)
    return lease["spec"].get("holderIdentity") if lease and not lease["metadata"].get("deletionTimestamp") else None


def writes_under_own_lease(pipeline: PipelineCluster) -> list[tuple[str, Request]]:
    """Replays the write log: the Lease's holder after every stored Lease write (POST/PUT: the body's
    holderIdentity; DELETE: nobody). Asserts that every other write a step pod stored was stored while
    the Lease was held by that pod's run, that a pod wrote the Lease only for its own run, and took it
    from another holder only once it had been unchanged for LEASE_S (a fresh Lease is never stolen).
    Returns the pods' other writes in order, with their run."""
    holder: str | None = None
    changed = 0.0
    out: list[tuple[str, Request]] = []
    for r in _stored(pipeline):
        run = _run_of(r)
        if _is_lease(r):
            assert r.method in ("POST", "PUT", "DELETE"), f"{r.method} {r.path}: the Lease is created, updated, deleted"
            new = None if r.method == "DELETE" else r.body["spec"]["holderIdentity"]
            if run:
                assert (new if r.method != "DELETE" else holder) == run_holder(run), \
                    f"{r.method} of the Lease by pod {_pod(r)} when held by {holder}, writing {new}"
                assert new is None or holder in (None, new) or r.at - changed >= LEASE_S, \
                    f"pod {_pod(r)} took the Lease from {holder} {r.at - changed:.1f} s after it last changed"
            holder, changed = new, r.at
        elif run:
            assert holder == run_holder(run), f"{r.method} {r.path} by pod {_pod(r)} while {holder} held the Lease"
            out.append((run, r))
    return out


def _wait_until(condition, running: threading.Thread, timeout_s: float, what: str) -> None:
    ends = time.monotonic() + timeout_s
    while not condition():
        assert running.is_alive(), f"the first run ended before {what}"
        assert time.monotonic() < ends, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.1)


def test_two_controllers_release_one_environment_one_run_at_a_time(pipeline):
    """Run `one` (controller 1) releases dev; while its validate step runs, run `two` (controller 2,
    so Argo's mutex does not hold it back) starts: its lock step finds the Lease held, sees it
    renewed and fails naming `run one`; its exit handler writes nothing. Every write `one` stored
    happened while `one` held the Lease, which it renewed during validate and no one took."""
    pipeline.seed("a")                                                   # stable: blue
    runs: dict[str, Run] = {}

    def submit(name: str, controller: str) -> None:
        runs[name] = pipeline.submit("pd-release.yaml", {}, name=name, controller=controller, pod_env=POD_ENV)

    one = threading.Thread(target=submit, args=("pd-release-one", "controller-1"))
    one.start()
    _wait_until(lambda: any(_is_lease(r) and r.method == "PUT" and _pod(r).startswith("pd-release-one.validate")
                            for r in _stored(pipeline)), one, 3600, "run one's validate step holding the Lease")
    two = threading.Thread(target=submit, args=("pd-release-two", "controller-2"))
    two.start()
    two.join(600)
    one.join(1800)
    assert not one.is_alive() and not two.is_alive()
    a, b = runs["pd-release-one"], runs["pd-release-two"]
    assert a.mutex == b.mutex == "pd-release-dev"     # one mutex name, two controllers: both ran

    # two: failed at its lock, naming the holder; not retried (exit 1 is not the transient 75)
    lock = b.task("lock")
    assert b.phase == "Failed" and lock.phase == "Failed" and len(lock.attempts) == 1, b.describe()
    assert "holder: run pd-release-one" in lock.log and "renewed the lock while we watched" in lock.log, lock.log
    assert b.phases().get("rollout") in ("Omitted", None), b.describe()
    assert "does not hold the release lock" in b.task("rollback-if-pending", on_exit=True).log, b.describe()
    assert "nothing to release" in b.task("unlock", on_exit=True).log, b.describe()
    log = list(pipeline.cluster.api.requests)
    assert [r for r in _stored(pipeline) if _run_of(r) == "pd-release-two"] == []   # not even the Lease

    # one: released dev; all its writes under its Lease, which two neither took nor changed
    assert a.phase == "Succeeded" and a.outputs.get("verdict") == "promote", a.describe()
    assert pipeline.stable_colour() == "green" and pipeline.rayservices() == {"pd-llm-green"}
    order = writes_under_own_lease(pipeline)
    assert {run for run, _ in order} == {"pd-release-one"} and len(order) > 3, [r.path for _, r in order]
    steps = {_pod(r).split(".")[1].split("(")[0] for _, r in order}
    assert steps >= {"rollout", "promote"}, [_pod(r) for _, r in order]
    one_lease = [r for r in _stored(pipeline) if _is_lease(r) and _run_of(r) == "pd-release-one"]
    taken, released = one_lease[0], one_lease[-1]
    assert (taken.method, _pod(taken)) == ("POST", "pd-release-one.lock(0)"), _pod(taken)
    assert (released.method, _pod(released)) == ("DELETE", "pd-release-one.onExit.unlock(0)"), _pod(released)
    two_seen = [r.at for r in log if _run_of(r) == "pd-release-two"]
    assert taken.at < min(two_seen) and max(two_seen) < released.at   # two ran entirely inside one's hold

    # the Lease renewed during validate (not only as the step began): renewTime advancing every LEASE_S/4
    renewals = [r for r in one_lease if r.method == "PUT" and _pod(r).startswith("pd-release-one.validate")]
    times = [r.body["spec"]["renewTime"] for r in renewals]
    assert len(renewals) >= 2 and times == sorted(set(times)), times
    gaps = [y.at - x.at for x, y in zip(renewals, renewals[1:], strict=False)]
    assert all(g >= LEASE_S * RENEW_EVERY * 0.9 for g in gaps), gaps
    assert _holder(pipeline) is None


def test_a_deleted_run_leaves_a_lease_that_expires_and_the_next_run_takes_it(pipeline):
    """Run `dead` is deleted (`kubectl delete workflow`: no exit handler) as soon as its lock step has
    taken the Lease. The next run waits while the Lease stays unchanged, takes it over LEASE_S after
    it last changed, and runs: its writes (skip-to-rollback: drop the pending candidate) all under
    its own Lease, which its exit handler releases."""
    pipeline.seed("a")                        # stable blue
    pipeline.seed("b", promote=False)         # a candidate pending in green
    dead = pipeline.submit("pd-release.yaml", {"skip-to-rollback": "true"}, name="pd-release-dead",
                           pod_env=POD_ENV, deleted_when=lambda: _holder(pipeline) == "run pd-release-dead")
    assert dead.phase == "Deleted" and _holder(pipeline) == "run pd-release-dead", dead.describe()
    left = [r for r in _stored(pipeline) if _is_lease(r)][-1]

    nxt = pipeline.submit("pd-release.yaml", {"skip-to-rollback": "true"}, name="pd-release-next", pod_env=POD_ENV)
    assert nxt.phase == "Succeeded", nxt.describe()
    lock = nxt.task("lock")
    assert "held by run pd-release-dead" in lock.log and "took over Lease pdops-release from run pd-release-dead" \
        in lock.log, lock.log
    takeover = next(r for r in _stored(pipeline) if _is_lease(r) and _run_of(r) == "pd-release-next")
    assert (takeover.method, takeover.body["spec"]["leaseTransitions"]) == ("PUT", 1)
    assert takeover.at - left.at >= LEASE_S      # not before the dead run's Lease went unchanged for its duration

    order = writes_under_own_lease(pipeline)
    assert {run for run, _ in order} == {"pd-release-next"} and order, [r.path for _, r in order]
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    assert [(h["revision"][0], h["verdict"]) for h in pipeline.history()] == [("a", "promote"), ("b", "rollback")]
    assert _holder(pipeline) is None
