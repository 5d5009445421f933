"""The committed kustomize/argo/pd-release.yaml and pd-canary.yaml, executed (the tier:
docs/argo.md#argo-execution-tier).

Emulated: Argo's controller and executor (tests/argo/engine.py, dag.py, workflow.py, pod.py, each
rule citing its upstream function), the Kubernetes API (kmock) with a simulated KubeRay and GPU
nodes, cluster DNS and Services (network.py), the git server (`git archive` of this repository).
Real: every step's command (`pdops ...` from the revision under test, in its own mount namespace
with the container's paths), and the engines it validates (KnownTimingServer on 127.0.0.1: real
HTTP and streaming with known latencies).

Assertions read the cluster (RayServices, the stable Service's selector, the history ConfigMap),
the workflow's phase, nodes and Prometheus series: the behaviour issue 12 asks for, not the DAG's
shape, so they hold across the lead's rewrite of the workflow.
"""
from __future__ import annotations

import pytest

from tests.argo.scenario import committed


def verdict_series(run, prefix: str = "pd_release"):
    return [(s.labels.get("verdict"), s.labels.get("status"), s.value) for s in run.series(f"{prefix}_verdict_total")]


def tasks_after(task: str, file: str = "pd-release.yaml") -> dict[str, float]:
    """Every task of the entrypoint DAG that runs after `task` (a node lost with all its pods)."""
    spec = committed(file)
    dag = spec.template(spec.entrypoint).dag.tasks
    after, grew = {task}, True
    while grew:
        more = {t.name for t in dag if t.depends and any(f"{a}." in t.depends for a in after)}
        grew, after = not more <= after, after | more
    return {t: 0.5 for t in after - {task}}


@pytest.fixture(scope="module")
def ui_promoted(make_pipeline):
    """A first release submitted from the Argo UI on a fresh cluster: what the UI test asserts, and the run the
    re-release test repeats (a full pipeline run is about 70 s of the tier; one serves both)."""
    pipeline = make_pipeline()
    return pipeline, pipeline.submit("pd-release.yaml", {}, via="ui")


def test_manual_run_from_the_ui_promotes(ui_promoted):
    pipeline, run = ui_promoted
    assert run.phase == "Succeeded", run.describe()
    assert pipeline.stable_colour() == "blue" and pipeline.rayservices() == {"pd-llm-blue"}
    last = pipeline.history()[-1]
    assert (last["verdict"], last["revision"]) == ("promote", pipeline.revision)
    assert verdict_series(run) == [("promote", "Succeeded", 1.0)] and run.metric_errors == []
    assert all(s.value > 0 for s in run.series("pd_release_ttft_ms")), run.metrics
    assert run.task("rollback-if-pending", on_exit=True).phase == "Skipped"


def test_re_releasing_the_serving_render_is_a_no_op_that_succeeds(ui_promoted):
    """Issue 22 item 2: the second run of the same revision finds its render stable and serving. The
    rollout step writes `unchanged` (steps.settle_candidate, the rule `pdops release` follows too), so
    validate is skipped by its `when` and promote/rollback are omitted; nothing is written to the cluster.
    The first run is the UI test's (how it was submitted does not matter to the second)."""
    pipeline, first = ui_promoted
    assert first.phase == "Succeeded" and pipeline.stable_colour() == "blue", first.describe()
    before = (pipeline.rayservices(), pipeline.stable_colour(), pipeline.history())
    run = pipeline.submit("pd-release.yaml", {})
    assert run.phase == "Succeeded", run.describe()
    assert run.outputs.get("verdict") == "unchanged", run.describe()
    assert run.task("rollout").phase == "Succeeded" and run.task("validate").phase == "Skipped", run.describe()
    assert {run.phases().get(t) for t in ("promote", "rollback")} <= {"Omitted", "Skipped", None}, run.describe()
    assert run.task("rollback-if-pending", on_exit=True).phase == "Skipped"
    assert (pipeline.rayservices(), pipeline.stable_colour(), pipeline.history()) == before
    assert verdict_series(run) == [("unchanged", "Succeeded", 1.0)] and run.metric_errors == []


def test_gate_failure_rolls_back_and_keeps_stable(pipeline):
    pipeline.seed("a")                                                  # stable: blue
    pipeline.next_engine(inter_token_delay=0.12)                       # ITL 2x dev's 60 ms p90 SLO (0.25: 2x slower)
    run = pipeline.submit("pd-release.yaml", {})
    assert run.outputs.get("verdict") == "rollback", run.describe()
    assert "ITL" in run.outputs.get("summary", "") or "itl" in run.outputs.get("summary", ""), run.describe()
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    assert [(h["revision"], h["verdict"]) for h in pipeline.history()][-1] == (pipeline.revision, "rollback")
    assert [v for v, _, _ in verdict_series(run)] == ["rollback"] and run.metric_errors == []


def test_failing_compat_case_reaches_the_gate_and_is_not_retried(pipeline):
    pipeline.seed("a")
    pipeline.next_engine(broken={"missing_done": True})                # streams end without data: [DONE]
    run = pipeline.submit("pd-release.yaml", {})
    assert run.outputs.get("verdict") == "rollback", run.describe()
    assert "compat" in run.outputs.get("summary", "").lower(), run.describe()   # the report says why
    assert pipeline.rayservices() == {"pd-llm-blue"}
    retried = {n.name: len(n.attempts) for n in run.nodes.values() if len(n.attempts) > 1}
    assert retried == {}, f"a verdict was retried as if transient: {retried}"
    assert [v for v, _, _ in verdict_series(run)] == ["rollback"]


def killed(run) -> list[str]:
    return [a.name for n in run.nodes.values() for a in [n, *n.attempts] if a.message.startswith("main: OOMKilled")]


def test_validate_killed_is_rolled_back_by_the_rollback_step(pipeline):
    """Issue 12: a candidate that fails validation is rolled back by the rollback step, the exit
    handler being the safety net. validate dies before writing its run folder (its optional output
    artifact `run` is not produced), and the rollback task passes it on with `from:`."""
    pipeline.seed("a")
    run = pipeline.submit("pd-release.yaml", {}, kill_after={"validate": 0.5})
    assert killed(run), run.describe()
    assert run.task("rollback").phase == "Succeeded", run.describe()
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    last = pipeline.history()[-1]
    assert last["verdict"] == "rollback" and not any("the workflow ended" in r for r in last["reasons"]), last


def test_steps_killed_after_rollout_are_rolled_back_by_the_exit_handler(pipeline):
    """Every step after rollout is SIGKILLed 0.5 s in (validate, and the rollback that would clean
    up): the candidate is left pending, and only the exit handler can remove it."""
    pipeline.seed("a")
    run = pipeline.submit("pd-release.yaml", {}, kill_after=tasks_after("rollout"))
    assert run.phase == "Failed", run.describe()
    assert killed(run), run.describe()
    assert "Succeeded" in run.phases(on_exit=True).values(), run.describe()
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    last = pipeline.history()[-1]
    # The rollback step now starts (its run artifact is optional) and may record the rollback before its
    # 0.5 s kill; either way the candidate is gone and the exit handler ran to success.
    assert last["verdict"] == "rollback" and any("the workflow ended Failed" in r or "did not pass validation" in r
                                                 for r in last["reasons"]), last


def test_dry_run_persists_nothing_and_still_reports(pipeline):
    pipeline.seed("a")
    before = (pipeline.rayservices(), pipeline.stable_colour(), pipeline.history())
    run = pipeline.submit("pd-release.yaml", {"dry-run": "true"})
    assert (pipeline.rayservices(), pipeline.stable_colour(), pipeline.history()) == before, run.describe()
    assert run.metric_errors == [] and len(verdict_series(run)) == 1


@pytest.fixture(scope="module")
def skip_run(make_pipeline):
    pipeline = make_pipeline()
    pipeline.seed("a")                        # stable blue
    pipeline.seed("b", promote=False)         # a candidate left pending in green by a run that died
    return pipeline, pipeline.submit("pd-release.yaml", {"skip-to-rollback": "true"}, via="ui")


def test_skip_to_rollback_drops_the_pending_candidate(skip_run):
    pipeline, run = skip_run
    assert run.phase == "Succeeded", run.describe()
    assert run.task("skip-to-rollback").phase == "Succeeded"
    assert set(run.phases().values()) - {"Skipped", "Omitted"} == {"Succeeded"}, run.describe()  # nothing else ran
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    assert [(h["revision"][0], h["verdict"]) for h in pipeline.history()] == [("a", "promote"), ("b", "rollback")]


def test_skip_to_rollback_still_emits_the_release_metrics(skip_run):
    _, run = skip_run
    assert run.metric_errors == [] and len(verdict_series(run)) == 1, run.metric_errors


def test_canary_rollback_restores_the_previous_good_release(pipeline):
    pipeline.seed("a")                                                   # blue, then
    pipeline.next_engine(inter_token_delay=0.12)   # 2x the 60 ms ITL p90 SLO (0.25 took 2x as long)
    pipeline.seed("b")                                                   # green is stable, and regressed
    run = pipeline.submit("pd-canary.yaml", {"on-regression": "rollback"}, via="ui")
    assert pipeline.stable_colour() == "blue" and pipeline.rayservices() == {"pd-llm-blue"}, run.describe()
    assert "itl" in run.outputs.get("canary-summary", run.outputs.get("summary", "")).lower(), run.describe()
    assert [h["verdict"] for h in pipeline.history() if h["revision"][0] == "b"][-1] != "promote"
    assert [v for v, _, _ in verdict_series(run, "pd_canary")] == ["rollback"]


def test_a_killed_canary_run_leaves_nothing_it_started(pipeline):
    """Issue 22 item 3: the canary's exit handler (`pdops run end --remove-started`) deletes the
    single-engine reference RayService a killed run started (with its GPUs) and releases the run's
    Lease. validate-stable is SIGKILLed as soon as the reference RayService exists."""
    from workflows.names import LOCK_NAME, ROLE_LABEL

    pipeline.seed("a")

    def started() -> bool:
        return any((o["metadata"].get("labels") or {}).get(ROLE_LABEL)
                   for o in pipeline.cluster.objects("rayservices", "llm-dev").values())

    run = pipeline.submit("pd-canary.yaml", {}, kill_after={"validate-stable": started})
    assert killed(run) and run.phase == "Failed", run.describe()
    assert run.task("cleanup", on_exit=True).phase == "Succeeded", run.describe()
    assert "removed pd-llm-reference" in run.task("cleanup", on_exit=True).log, run.describe()
    assert pipeline.rayservices() == {"pd-llm-blue"} and pipeline.stable_colour() == "blue"
    assert LOCK_NAME not in {n for n, o in pipeline.cluster.objects("leases", "llm-dev").items()
                             if not o["metadata"].get("deletionTimestamp")}
