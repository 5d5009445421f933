"""Every cluster-writing step of the Kubernetes target is idempotent and resumable (issue 22).

rollout, promote, rollback and restore (`rollback --to-previous`) are each run with a fault at EVERY
write they send, in turn, of each kind a step meets on a real cluster (tests/fakes/kube/server.py
WriteFault): a 500 (not stored), a 409 Conflict (not stored), a 504 timeout whose write was stored
anyway, and the step's process killed right after a write was stored (nothing later reaches the
cluster). Then the step is retried, as a new process, the way Argo retries exit 75 or the next run
picks up. Asserted for every case:

- users are never on a missing or unvalidated colour: after every change the API server commits
  (not only at the end), the colour the Service `pd-llm` selects holds a RayService that exists,
  is not terminating, is ready as KubeRay v1.7.0 reports it (workflows/targets/kube/readiness.py) and
  carries a release that passed validation in the scenario;
- the retry succeeds and converges to the one state a fault-free run reaches (slots, RayServices,
  PodDisruptionBudgets, the Service's colour, the history's verdicts).
A promote that fails at any write is also followed by the exit handler instead of a retry: users end
on the previous stable release or the promoted one.

Emulated: the API server (tests/fakes/kube/store.py: resourceVersion, uid preconditions answered 409
as kube-apiserver's storage/errors/storage.go InterpretDeleteError does, finalizers, server-side apply),
KubeRay ray-operator v1.7.0 (tests/fakes/kube/kuberay.py: the RayService finalizer holds a deleted
colour until its RayCluster is gone, rayservice_controller.go Reconcile; Ready condition and
application statuses), EndpointSlices and the drain. Real: the `kubernetes` client and the target.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.fakes.kube import start_cluster
from tests.fakes.kube.server import FAULT_KINDS, WriteFault
from tests.fakes.kube.store import BY_KIND
from tests.kube_support import LOCAL_NS, Lines, record, release
from tests.kube_support import target as _target
from workflows.names import COLOUR_LABEL, DIGEST_ANNOTATION
from workflows.targets.base import TargetError
from workflows.targets.kube.readiness import rayservice_state

# Writes each step sends on a fault-free run (the local overlay: history, ServiceAccount, two PDBs,
# RayService; the Service; deletes of two PDBs and a RayService). test_the_write_counts_are_what_the_steps_send
# fails when a step sends more or fewer, so no write goes untested.
WRITES = {"rollout": 5, "promote": 5, "rollback": 4, "restore": 10}
TICK_S = 0.02
CASES = [(op, n, kind) for op, count in WRITES.items() for n in range(1, count + 1) for kind in FAULT_KINDS]


@dataclass
class Watch:
    """Checks, after every change the API server commits, that the Service selects a colour users can be on."""

    cluster: object
    validated: set[str]
    problems: list[str] = field(default_factory=list)

    def __call__(self, key, _obj) -> None:
        store = self.cluster.store  # type: ignore[attr-defined]
        service = store.find(BY_KIND["Service"], LOCAL_NS, "pd-llm")
        if service is None:
            return
        colour = (service["spec"].get("selector") or {}).get(COLOUR_LABEL)
        rs = store.find(BY_KIND["RayService"], LOCAL_NS, f"pd-llm-{colour}")
        if rs is None:
            problem = f"the Service selects {colour}, which has no RayService"
        else:
            digest = (rs["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION)
            found = rayservice_state(rs)
            problem = ("" if found.state == "ready" and digest in self.validated
                       else f"the Service selects {colour}: {found.detail}, release {str(digest)[7:19]}"
                            f"{'' if digest in self.validated else ' (not validated)'}")
        if problem and (not self.problems or not self.problems[-1].startswith(problem)):
            self.problems.append(f"{problem} (after a change to {key[0].plural}/{key[2]})")


@dataclass
class Scenario:
    prepare: Callable[[object], None]   # target -> the state before the step
    step: Callable[[object], object]     # target -> runs the step
    validated: tuple[str, ...]           # variants whose release passed the gate


def target(cluster, **kwargs):
    return _target(cluster, **{"poll_s": TICK_S, "drain_grace_s": 2 * TICK_S, **kwargs})


def _scenarios(manifests) -> dict[str, Scenario]:
    a, b = record(manifests, variant="a"), record(manifests, variant="b")

    def candidate(t) -> None:
        release(t, a)
        t.apply(b, Lines())
        t.wait_ready(30, Lines())

    def rollout(t) -> object:
        t.apply(b, Lines())
        return t.wait_ready(30, Lines())

    def two_releases(t) -> None:
        release(t, a)
        release(t, b)

    return {
        "rollout": Scenario(lambda t: release(t, a), rollout, ("a",)),
        "promote": Scenario(candidate, lambda t: t.promote(["gate: promote"], None, Lines()), ("a", "b")),
        "rollback": Scenario(candidate, lambda t: t.rollback(["gate: rollback"], None, Lines()), ("a",)),
        "restore": Scenario(two_releases, lambda t: t.rollback(["canary: regressed"], None, Lines(), to_previous=True,
                                                               regressed=b.digest), ("a", "b")),
    }


def _state(cluster) -> dict:
    """What users and the next run see: Service colour, live RayServices and PDBs, slots, history verdicts."""
    def live(plural: str) -> dict[str, dict]:
        return {n: o for n, o in cluster.objects(plural, LOCAL_NS).items()
                if not o["metadata"].get("deletionTimestamp")}
    history = target(cluster).history()
    status = target(cluster).status()
    service = cluster.objects("services", LOCAL_NS).get("pd-llm") or {}
    stable, candidate = status.stable.release, status.candidate.release
    return {
        "service": service.get("spec", {}).get("selector", {}).get(COLOUR_LABEL),
        "rayservices": {n: (o["metadata"]["annotations"].get("test/variant", "r"), rayservice_state(o).state)
                        for n, o in live("rayservices").items()},
        "pdbs": sorted(live("poddisruptionbudgets")),
        "stable": stable and (stable.revision[0], stable.colour, status.stable.state),
        "candidate": candidate and (candidate.revision[0], candidate.colour),
        "history": [(r.revision[0], r.verdict) for r in history],
    }


def _run(manifests, op: str, fault: WriteFault | None, tmp_path,
         then: Callable[[object], object] | None = None) -> tuple[dict, list[str], object]:
    """Prepare the scenario on a new cluster, run the step once (with `fault`), then retry it (or run
    `then`, e.g. the exit handler) if a fault fired. Returns the final state, the Watch's problems and
    the first try's error (fault-free: the number of writes sent)."""
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig", tick_s=TICK_S)
    try:
        scenario = _scenarios(manifests)[op]
        scenario.prepare(target(cluster))
        watch = Watch(cluster, {record(manifests, variant=v).digest for v in scenario.validated})
        cluster.store.listeners.append(watch)
        before = len(cluster.writes())
        cluster.faults.write = fault
        error = None
        try:
            scenario.step(target(cluster))
        except TargetError as exc:
            error = exc
        cluster.faults.write = None
        if fault is not None:
            assert fault.fired is not None, f"write #{fault.nth} was never sent ({len(cluster.writes()) - before} sent)"
            (then or scenario.step)(target(cluster))   # a new process, reading the cluster afresh
        time.sleep(4 * TICK_S)   # KubeRay's last status updates, checked by the Watch too
        return _state(cluster), watch.problems, error if fault is not None else len(cluster.writes()) - before
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def clean(manifests, tmp_path_factory):
    """A step on a fault-free run (once per step): its end state, the Watch's problems, the writes it sent."""
    runs: dict[str, tuple] = {}

    def of(op: str) -> tuple:
        if op not in runs:
            runs[op] = _run(manifests, op, None, tmp_path_factory.mktemp(op))
        return runs[op]
    return of


def test_the_write_counts_are_what_the_steps_send(clean):
    assert {op: clean(op)[2] for op in WRITES} == WRITES
    assert all(clean(op)[1] == [] for op in WRITES)
    assert clean("promote")[0]["service"] == "green" and clean("restore")[0]["service"] == "blue"


@pytest.mark.parametrize(("op", "nth", "kind"), CASES, ids=[f"{op}-write{n}-{kind}" for op, n, kind in CASES])
def test_a_fault_at_every_write_leaves_users_on_a_serving_colour_and_the_retry_converges(
        manifests, clean, tmp_path, op, nth, kind):
    fault = WriteFault(nth, kind, agent="pdops-test")
    state, problems, error = _run(manifests, op, fault, tmp_path)
    assert problems == [], f"{op}, {kind} at write #{nth} ({fault.fired.method} {fault.fired.path}): {problems}"
    assert state == clean(op)[0], (f"{op}, {kind} at write #{nth} ({fault.fired.method} {fault.fired.path}; "
                                   f"first try: {error}): the retry ended elsewhere")
    if kind in ("500", "409", "timeout"):   # the API server's answer: the step says to retry (exit 75)
        assert error is not None and error.transient, f"{op}, {kind} at write #{nth}: {error!r}"


def test_rollout_after_a_promote_recorded_but_not_switched_never_touches_the_colour_users_are_on(manifests, tmp_path):
    """Issue 22 item 1 as reported: the history names b (green) stable, but the Service still selects
    blue, where a still serves (a promote of an older pdops recorded first and died on the switch). The
    next release used to delete blue as a "leftover" and apply c over it: users on an unvalidated
    candidate. Now rollout first points users at the recorded stable (ready, then drained) and only then
    takes the other colour."""
    from kubernetes import client

    from tests.kube_support import eventually
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    try:
        a, b, c = (record(manifests, variant=v) for v in "abc")
        release(target(cluster), a)
        old_blue = cluster.objects("rayservices", LOCAL_NS)["pd-llm-blue"]
        release(target(cluster), b)
        eventually(lambda: "pd-llm-blue" not in cluster.objects("rayservices", LOCAL_NS))
        client.CustomObjectsApi(cluster.client("chaos")).create_namespaced_custom_object(
            "ray.io", "v1", LOCAL_NS, "rayservices", {k: v for k, v in old_blue.items() if k != "status"})
        eventually(lambda: rayservice_state(cluster.objects("rayservices", LOCAL_NS)["pd-llm-blue"]).state == "ready")
        client.CoreV1Api(cluster.client("chaos")).patch_namespaced_service(
            "pd-llm", LOCAL_NS, {"spec": {"selector": {COLOUR_LABEL: "blue"}}}, _preload_content=False)
        watch = Watch(cluster, {a.digest, b.digest})
        cluster.store.listeners.append(watch)

        progress = Lines()
        target(cluster).apply(c, progress)
        target(cluster).wait_ready(30, Lines())
        assert watch.problems == [], watch.problems
        assert any("pointing users at it first" in line for line in progress), progress
        state = _state(cluster)
        assert state["service"] == "green" and state["candidate"] == ("c", "blue")
        assert state["rayservices"] == {"pd-llm-green": ("b", "ready"), "pd-llm-blue": ("c", "ready")}
    finally:
        cluster.close()


def _exit_handler(t) -> None:
    """pd-release's onExit: `pdops rollback --if-candidate-pending` (release_cli.cmd_rollback)."""
    if t.status().candidate.release is not None:
        t.rollback(["the workflow ended Failed with a candidate pending"], None, Lines())


@pytest.mark.parametrize(("nth", "kind"), [(n, k) for n in range(1, WRITES["promote"] + 1) for k in FAULT_KINDS],
                         ids=[f"promote-write{n}-{k}" for n in range(1, WRITES["promote"] + 1) for k in FAULT_KINDS])
def test_a_promote_that_fails_at_any_write_and_is_not_retried_is_safe_after_the_exit_handler(
        manifests, clean, tmp_path, nth, kind):
    """Retries exhausted (or the pod killed: Argo retries exit 75 only), the exit handler runs instead.
    A candidate still pending is rolled back; if users were already moved to it (the switch landed, the
    record did not), they are moved back to the stable colour, ready first and drained, before it is
    deleted. If the record landed, users stay on the promoted release."""
    fault = WriteFault(nth, kind, agent="pdops-test")
    state, problems, _ = _run(manifests, "promote", fault, tmp_path, then=_exit_handler)
    assert problems == [], f"{kind} at write #{nth} ({fault.fired.method} {fault.fired.path}): {problems}"
    rolled_back = {"service": "blue", "rayservices": {"pd-llm-blue": ("a", "ready")},
                   "stable": ("a", "blue", "ready"), "candidate": None,
                   "history": [("a", "promote"), ("b", "rollback")]}
    promoted = {"service": "green", "stable": ("b", "green", "ready"), "candidate": None,
                "history": [("a", "promote"), ("b", "promote")]}
    got = {k: state[k] for k in rolled_back}
    assert got == rolled_back or ({k: state[k] for k in promoted} == promoted
                                  and state["rayservices"]["pd-llm-green"] == ("b", "ready")), state


# ---- one rule for what an earlier run left, in `pdops release` and the Argo rollout step (issue 22 item 5) ----

def _rollout_step(cluster, monkeypatch, out) -> tuple[int, str]:
    """`pdops rollout` as the Argo step runs it (render + check overlays/local, settle, apply, wait), on
    the test cluster: the step's target with the test's fast polling."""
    from tests.conftest import ROOT
    from workflows.cli import release as release_cli
    from workflows.cli.main import main

    monkeypatch.setattr(release_cli, "open_target", lambda args, step=None: target(cluster))
    code = main(["rollout", "--target", "kubernetes", "--overlay", str(ROOT / "overlays" / "local"), "--namespace",
                 LOCAL_NS, "--revision", "r" * 40, "--timeout", "30", "--outputs", str(out)])
    return code, (out / "verdict").read_text() if (out / "verdict").is_file() else ""


def _writes(cluster) -> list[str]:
    return [f"{r.method} {r.path}" for r in cluster.writes() if "/leases" not in r.path]


def test_the_rollout_step_settles_a_half_done_candidate_resumes_its_own_and_calls_a_re_release_unchanged(
        manifests, tmp_path, monkeypatch):
    """The same `steps.settle_candidate` `pdops release` calls: another release's candidate left pending
    is rolled back (the step used to fail: "candidate ... is pending"), its own pending candidate is
    resumed, and the render that already serves as stable is `unchanged` (exit 0, nothing written)."""
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    try:
        release(target(cluster), record(manifests, variant="a"))
        target(cluster).apply(record(manifests, variant="b"), Lines())   # left pending by a run that died
        assert _rollout_step(cluster, monkeypatch, tmp_path / "1") == (0, "pending")
        state = _state(cluster)
        assert state["history"] == [("a", "promote"), ("b", "rollback")]
        assert "superseded by" in target(cluster).history()[-1].reasons[0]
        assert (state["service"], state["candidate"]) == ("blue", ("r", "green"))

        writes = len(_writes(cluster))
        assert _rollout_step(cluster, monkeypatch, tmp_path / "2") == (0, "pending")   # a retry: resumed
        assert _writes(cluster)[writes:] == []

        target(cluster).promote(["gate: promote"], None, Lines())
        writes = len(_writes(cluster))
        assert _rollout_step(cluster, monkeypatch, tmp_path / "3") == (0, "unchanged")
        assert _writes(cluster)[writes:] == [] and _state(cluster)["service"] == "green"
    finally:
        cluster.close()


def test_a_retried_restore_does_not_regress_the_release_it_restored(manifests, tmp_path, monkeypatch):
    """`rollback --to-previous --report RUN` regresses the release RUN's validation judged (validated.json,
    written by `pdops validate`): its retry after the restore completed changes nothing."""
    import json

    from workflows.cli import release as release_cli
    from workflows.cli.main import main

    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    try:
        a, b, c = (record(manifests, variant=v) for v in "abc")
        for r in (a, b, c):
            release(target(cluster), r)
        run = tmp_path / "run"
        run.mkdir()
        (run / "validated.json").write_text(json.dumps({"slot": "stable", "release": c.short()}))
        monkeypatch.setattr(release_cli, "open_target", lambda args, step=None: target(cluster))
        argv = ["rollback", "--target", "kubernetes", "--namespace", LOCAL_NS, "--to-previous", "--report", str(run),
                "--reason", "pd-canary: stable release regressed"]
        assert main(argv) == 0
        assert main(argv) == 0   # the retry
        state = _state(cluster)
        assert state["history"] == [("a", "promote"), ("b", "promote"), ("c", "regressed"), ("b", "promote")]
        assert state["stable"] == ("b", "green", "ready") and state["service"] == "green"
        assert set(state["rayservices"]) == {"pd-llm-green"}
    finally:
        cluster.close()
