"""vs_stable measured live: candidate and stable interleaved in one release (validation/interleave.py).

The block order and drift cancellation run on a synthetic bench runner (no servers: what is tested
is the schedule and the merge). The release test runs `steps.validate_slot` with two known-timing
fake servers standing in for the candidate and the stable slot (the target is a recording stand-in;
the compat suite, harness, rank tests and gate are real).
"""
from __future__ import annotations

import statistics

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from tests.unit.test_release_flow import RecordingTarget, edit, endpoint, overlay, server  # noqa: F401
from validation import interleave
from validation.metrics import summary
from workflows import steps
from workflows.targets.base import SlotStatus, TargetStatus


def test_blocks_alternate_which_side_goes_first():
    assert interleave.order(1) == ["candidate", "stable"]
    assert "".join(s[0] for s in interleave.order(4)) == "cssccssc"
    assert interleave.split(16, 4) == [4, 4, 4, 4] and interleave.split(10, 4) == [3, 3, 2, 2]
    assert interleave.effective_blocks(3, 4, False) == 1      # never blocks of one request
    assert interleave.effective_blocks(300, 4, True) == 1     # a trace keeps its arrival times


def drifting_runner(calls: list[tuple]):
    """Each request's TTFT is 100 ms plus 1 ms per request sent before it, on either side: a
    machine that slows linearly over the release; candidate and stable are otherwise equal."""
    clock = {"n": 0}

    def run(side, n, dur, warmup, k):
        calls.append((side, n, warmup, k))
        ttft = [100.0 + clock["n"] + j for j in range(n)]
        clock["n"] += n
        return {"requests_total": n, "requests_ok": n, "errors": 0, "goodput_requests": n, "wall_s": 1.0,
                "samples": {"ttft": ttft, "tpot": [], "itl": [], "itl_counts": []}, "ttft_ms": summary(ttft)}
    return run


def test_abba_cancels_linear_drift_that_ab_puts_on_one_side():
    calls: list[tuple] = []
    cand, stab = interleave.measure(drifting_runner(calls), 64, None, 2, 4)
    assert [c[0][0] for c in calls] == list("cssccssc") and [c[1] for c in calls] == [16] * 8
    assert [c[2] for c in calls] == [2, 2, 0, 0, 0, 0, 0, 0]   # each side's first block is warmed up
    assert cand.requests_ok == stab.requests_ok == 64 and cand.interleaved.order == "CSSCCSSC"
    assert cand.looks is None and len(cand.interleaved.per_block) == 4
    live_gap = statistics.mean(cand.samples.ttft) - statistics.mean(stab.samples.ttft)
    ab_c, ab_s = interleave.measure(drifting_runner([]), 64, None, 0, 1)
    ab_gap = statistics.mean(ab_c.samples.ttft) - statistics.mean(ab_s.samples.ttft)
    assert abs(live_gap) == 0.0 and ab_gap == -64.0   # AB: the whole drift lands on stable


class TwoSlotTarget(RecordingTarget):
    def __init__(self, candidate_ep, stable_ep):
        super().__init__(candidate_ep)
        self.stable_ep = stable_ep
        self.asked: list[str] = []

    def endpoint(self, slot):
        self.asked.append(slot)
        return self.stable_ep if slot == "stable" else self.endpoint_


@pytest.fixture(scope="module")
def faster_stable():
    with KnownTimingServer(first_token_delay=0.002, inter_token_delay=0.005, tokens=8, model="pdops-tiny") as srv:
        yield srv


def slots(server, faster_stable, overlay, tmp_path, vs_stable):
    """A promoted stable whose recorded baseline is the candidate's own speed, serving 10x faster now."""
    target = TwoSlotTarget(endpoint(server), endpoint(faster_stable))
    out, _ = steps.release(overlay, target, steps.new_run_dir(tmp_path / "runs", "local"), lambda m: None,
                           revision="first"), None
    assert out.verdict == "promote", out.reasons
    stable = target.stable.model_copy(update={"baseline": target.baseline, "report": "/gone", "verdict": "promote"})
    target.status = lambda: TargetStatus(  # type: ignore[method-assign]
        target="recording", stable=SlotStatus(slot="stable", release=stable, state="ready"),
        candidate=SlotStatus(slot="candidate", release=target.candidate), last_good=stable)
    edit(overlay, slo__vs_stable=vs_stable, validation__load=[
        {"profile": "balanced", "concurrency": 2, "requests": 8, "warmup_requests": 0}])
    rendered = steps.load_release(str(overlay), None)
    target.candidate = steps.record_of(rendered, "next").model_copy(update={"colour": "green"})
    target.asked.clear()
    return target, rendered


def test_live_stable_is_measured_in_the_release_and_a_slower_candidate_fails(
        server, faster_stable, overlay, tmp_path, monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, rendered = slots(server, faster_stable, overlay, tmp_path, {"ttft_p90": 1.5, "blocks": 2})
    logs: list[str] = []
    (tmp_path / "v").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", logs.append, digest=target.candidate.digest)
    assert target.asked.count("stable") == 1 and any("interleaved" in m for m in logs), logs
    (stab,) = result.stable_benches
    assert stab.requests_ok == 8 and stab.interleaved.order == "CSSC"
    assert (tmp_path / "v" / "stable-bench-0-balanced.json").exists()
    failed = [c.check for c in result.decision.checks if not c.ok]
    # the recorded baseline (the candidate's own speed) would pass; the live stable is 10x faster
    assert failed == ["vs_stable_ttft_p90"], result.decision.reasons


def test_recorded_measure_keeps_the_baseline_and_leaves_stable_unloaded(
        server, faster_stable, overlay, tmp_path, monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, rendered = slots(server, faster_stable, overlay, tmp_path, {"ttft_p90": 1.5, "measure": "recorded"})
    (tmp_path / "v").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", lambda m: None, digest=target.candidate.digest)
    assert "stable" not in target.asked and result.stable_benches is None
    assert not [c for c in result.decision.checks if not c.ok], result.decision.reasons
