"""Phase balance inside `steps.release` (the release and the canary run the same validation): a
candidate whose prefill side queues is reported prefill-bound with the advice and a checked patch
in its run folder, promoted by default, rolled back when the spec says validation.balance.block."""
from __future__ import annotations

import subprocess

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from tests.fakes.pd_queues import PDQueues
from tests.unit.test_release_flow import RecordingTarget, edit, overlay, run  # noqa: F401 - fixture
from workflows.cli.main import main
from workflows.pipeline import steps
from workflows.targets.base import Endpoint


@pytest.fixture
def queued(monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)   # ordering, not client health
    pd = PDQueues(prefill_slots=1, decode_slots=32, prefill_s=0.05)
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.002, tokens=8, model="pdops-tiny", pd=pd) as srv:
        yield Endpoint(base_url=srv.base_url, metrics_url=srv.base_url.removesuffix("/v1") + "/metrics",
                       metrics_phases=pd.phases)


def load(overlay):  # noqa: F811
    # 16 in flight against one 50 ms prefill slot: ~15 wait there, three times the threshold (a client
    # slowed by a busy machine keeps fewer in flight)
    edit(overlay, validation__load=[{"profile": "balanced", "concurrency": 16, "requests": 64, "warmup_requests": 0}])


def test_a_prefill_bound_candidate_is_reported_with_a_checked_patch(queued, overlay, tmp_path):  # noqa: F811
    load(overlay)
    out, folder = run(overlay, RecordingTarget(queued), tmp_path)
    assert out.verdict == "promote", out.reasons      # reported, not gated by default
    summary = (folder / "summary.md").read_text()
    assert "## Phase balance" in summary and "**prefill-bound**" in summary, summary
    assert "## Advice (phase balance)" in summary and "release.yaml prefill.replicas: 1 -> " in summary
    patch = folder / "advice.patch"
    root = overlay.parent.parent
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
    assert main(["check", str(overlay)]) == 0


def test_validation_balance_block_rolls_back_an_imbalanced_candidate(queued, overlay, tmp_path):  # noqa: F811
    load(overlay)
    edit(overlay, validation__balance={"block": True})
    out, _ = run(overlay, RecordingTarget(queued), tmp_path)
    assert out.verdict == "rollback"
    assert any("prefill-bound" in r for r in out.reasons), out.reasons


def test_the_canary_reports_how_the_queues_moved_since_promotion(queued, overlay, tmp_path):  # noqa: F811
    load(overlay)
    target = RecordingTarget(queued)
    out, _ = run(overlay, target, tmp_path)
    assert out.verdict == "promote" and target.baseline[0]["balance"]["verdict"] == "prefill-bound"
    target.stable = target.stable.model_copy(update={"baseline": target.baseline, "verdict": "promote"})
    rendered = steps.load_release(str(overlay), None)
    (tmp_path / "canary").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "canary", lambda m: None, slot="stable",
                                 rendered=rendered)
    assert result.decision.verdict == "promote"        # imbalance is reported, not blocking
    trend = [a for a in result.decision.advice if "since the baseline run" in a]
    assert trend and trend[0].startswith("#0 balanced c=16: prefill-bound -> prefill-bound"), result.decision.advice
    assert "prefill waiting/engine" in trend[0] and trend[0] in (tmp_path / "canary" / "summary.md").read_text()
