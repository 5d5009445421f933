"""vs_stable measured live: candidate and stable interleaved in one release (validation/interleave.py).

The block order and drift cancellation run on a synthetic bench runner (no servers: what is tested
is the schedule and the merge). The release test runs `steps.validate_slot` with two known-timing
fake servers standing in for the candidate and the stable slot (the target is a recording stand-in;
the compat suite, harness, rank tests and gate are real).
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from contextlib import contextmanager, nullcontext

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from tests.fakes.starved_client import starve
from tests.unit import test_release_flow
from tests.unit.test_release_flow import RecordingTarget, edit, endpoint
from validation import interleave
from validation.metrics import summary
from workflows.pipeline import steps
from workflows.targets.base import Baseline, Skipped, SlotStatus, TargetStatus

# test_release_flow's fixtures, as names of this module (pytest collects fixtures by name; imported, the test
# functions' arguments shadowed them: ruff F811)
overlay, server = test_release_flow.overlay, test_release_flow.server


def test_order_is_seeded_reproducible_and_balanced():
    for pairs in (1, 2, 3, 4, 7, 8):
        for seed in range(50):
            o = interleave.order(pairs, seed)
            assert o == interleave.order(pairs, seed)                     # the recorded seed replays it
            assert all(sorted(p) == ["candidate", "stable"] for p in o)   # one block of each side per pair
            firsts = [p[0] for p in o].count("candidate")
            assert firsts in ({pairs // 2} if pairs % 2 == 0 else {pairs // 2, pairs // 2 + 1})
    labels = {interleave.order_label(interleave.order(4, seed)) for seed in range(200)}
    assert len(labels) == 6   # C(4, 2) balanced orders of 4 pairs, all reachable: not a fixed pattern
    odd_first = {interleave.order(3, seed)[-1][0] for seed in range(50)}
    assert odd_first == {"candidate", "stable"}
    assert interleave.split(16, 4) == [4, 4, 4, 4] and interleave.split(10, 4) == [3, 3, 2, 2]
    assert interleave.effective_blocks(3, 4, False) == 1      # never blocks of one request
    assert interleave.effective_blocks(300, 4, True) == 1     # a trace keeps its arrival times


def drifting_runner(calls: list[tuple], void: dict[tuple[str, int], str] | None = None):
    """Each request's TTFT is 100 ms plus 1 ms per request sent before it, on either side: a
    machine that slows linearly over the release; candidate and stable are otherwise equal.
    `void`: (side, block) -> the reason that block raises VoidBlock."""
    clock = {"n": 0}

    def run(side, n, dur, warmup, k):
        calls.append((side, n, warmup, k))
        if void and (side, k) in void:
            raise interleave.VoidBlock(void[side, k])
        ttft = [100.0 + clock["n"] + j for j in range(n)]
        clock["n"] += n
        return {"requests_total": n + 1, "requests_ok": n, "errors": 1, "goodput_requests": n, "wall_s": 1.0,
                "samples": {"ttft": ttft, "tpot": [], "itl": [], "itl_counts": [0] * n, "outcomes": [1] * n + [0]},
                "ttft_ms": summary(ttft)}
    return run


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_balanced_random_order_cancels_linear_drift_that_ab_puts_on_one_side(seed):
    calls: list[tuple] = []
    cand, stab = interleave.measure(drifting_runner(calls), 64, None, 2, 4, seed=seed)
    assert [c[1] for c in calls] == [16] * 8
    assert "".join(c[0][0].upper() for c in calls) == cand.interleaved.order == \
        interleave.order_label(interleave.order(4, seed))
    assert cand.requests_ok == stab.requests_ok == 64 and cand.interleaved.seed == seed
    assert cand.looks is None and len(cand.interleaved.per_block) == 4 and cand.interleaved.pairs == 4
    live_gap = statistics.mean(cand.samples.ttft) - statistics.mean(stab.samples.ttft)
    ab_c, ab_s = interleave.measure(drifting_runner([]), 64, None, 0, 1, seed=seed)
    ab_gap = statistics.mean(ab_c.samples.ttft) - statistics.mean(ab_s.samples.ttft)
    assert abs(live_gap) == 0.0 and abs(ab_gap) == 64.0   # one pair: the whole drift lands on one side


def test_every_block_is_warmed_up_and_labelled():
    calls: list[tuple] = []
    cand, stab = interleave.measure(drifting_runner(calls), 40, None, 3, 4, seed=7, first_block=4)
    assert [c[2] for c in calls] == [3] * 8                       # warm-up at every block, not only the first
    assert sorted(c[3] for c in calls) == [4, 4, 5, 5, 6, 6, 7, 7]   # a later look continues the block count
    for bench in (cand, stab):
        s = bench.samples
        assert s.block == [4] * 10 + [5] * 10 + [6] * 10 + [7] * 10 and len(s.block) == len(s.ttft)
        assert s.outcome_block == [k for k in (4, 5, 6, 7) for _ in range(11)]
        assert len(s.outcome_block) == len(s.outcomes) == bench.requests_total == 44
        assert [b["block"] for b in bench.interleaved.per_block] == [4, 5, 6, 7]
    # candidate block k and stable block k saw the same prompts and load: same seed, same size
    assert {(c[1], c[3]) for c in calls if c[0] == "candidate"} == {(c[1], c[3]) for c in calls if c[0] == "stable"}


def test_tpot_has_its_own_block_labels_when_a_request_has_no_tpot():
    """Measured on the real stack: Ray Serve sent 2 of 16 streams in one socket read, so they have no
    TPOT and `tpot` is shorter than `block`; tpot_block keeps the judge pairing TPOT by block."""
    from validation.judge import request_values

    def run(side, n, dur, warmup, k):
        return {"requests_total": n, "requests_ok": n, "errors": 0, "wall_s": 1.0,
                "samples": {"ttft": [100.0] * n, "tpot": [5.0 + k] * (n - 1), "itl": [], "itl_counts": [0] * n,
                            "outcomes": [1] * n}}
    cand, _ = interleave.measure(run, 16, None, 0, 4, seed=1)
    s = cand.samples
    assert len(s.block) == 16 and s.tpot_block == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    vals, ids = request_values(cand, "tpot_ms")
    assert list(ids) == s.tpot_block and list(vals) == [5.0] * 3 + [6.0] * 3 + [7.0] * 3 + [8.0] * 3


def test_a_void_block_drops_its_whole_pair_and_says_why():
    calls: list[tuple] = []
    run = drifting_runner(calls, {("stable", 1): "3 requests on the baseline were not ours"})
    cand, stab = interleave.measure(run, 16, None, 0, 4, seed=11)
    assert cand.samples.block == stab.samples.block == [0] * 4 + [2] * 4 + [3] * 4
    assert cand.requests_ok == stab.requests_ok == 12 and cand.interleaved.pairs == 3
    (v,) = cand.interleaved.void
    assert (v.pair, v.side, v.reason) == (1, "stable", "3 requests on the baseline were not ours")
    first = interleave.order(4, 11)[1][0]
    # the candidate's block of pair 1 ran only when it went first; either way it is not in the merge
    assert [c for c in calls if c[3] == 1] == ([("candidate", 4, 0, 1)] if first == "candidate" else []) + \
        [("stable", 4, 0, 1)]


def test_all_pairs_void_is_no_comparison_but_keeps_the_candidates_blocks():
    void = {("stable", k): "baseline gone" for k in range(4)}
    with pytest.raises(interleave.AllVoid) as exc:
        interleave.measure(drifting_runner([], void), 16, None, 0, 4, seed=3)
    assert len(exc.value.void) == 4 and "baseline gone" in str(exc.value)
    ran_first = [p[0] for p in interleave.order(4, 3)].count("candidate")
    assert (exc.value.candidate.requests_ok if exc.value.candidate else 0) == 4 * ran_first


class TwoSlotTarget(RecordingTarget):
    """A candidate, a user-facing stable slot (never to be loaded by validation) and a baseline of the
    stable release that baseline_server starts and stops (`skip`: the reason none can run)."""

    def __init__(self, candidate_ep, user_ep, baseline_ep, skip=None):
        super().__init__(candidate_ep)
        self.user_ep, self.baseline_ep, self.skip = user_ep, baseline_ep, skip
        self.asked: list[str] = []
        self.baselines: list[tuple[str, str]] = []   # ("started" | "stopped", the record's digest)

    def endpoint(self, slot):
        self.asked.append(slot)
        return self.user_ep if slot == "stable" else self.endpoint_

    @contextmanager
    def baseline_server(self, record, progress):
        if self.skip:
            yield Skipped(self.skip)
            return
        self.baselines.append(("started", record.digest))
        try:
            yield Baseline(endpoint=self.baseline_ep, release=record.short(), how="a test baseline",
                           void_reason=interleave.foreign_requests)
        finally:
            self.baselines.append(("stopped", record.digest))


@pytest.fixture(scope="module")
def faster_stable():
    with KnownTimingServer(first_token_delay=0.002, inter_token_delay=0.005, tokens=8, model="pdops-tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def user_facing():
    """The stable slot users reach: validation must never send it a request."""
    with KnownTimingServer(first_token_delay=0.002, inter_token_delay=0.005, tokens=8, model="pdops-tiny") as srv:
        yield srv


def slots(server, faster_stable, user_facing, overlay, tmp_path, vs_stable, skip=None):
    """A promoted stable whose recorded baseline is the candidate's own speed; its baseline serves 10x faster."""
    target = TwoSlotTarget(endpoint(server), endpoint(user_facing), endpoint(faster_stable), skip)
    out, _ = steps.release(overlay, target, steps.new_run_dir(tmp_path / "runs", "local"), lambda m: None,
                           revision="first"), None
    assert out.verdict == "promote", out.reasons
    stable = target.stable.model_copy(update={"baseline": target.baseline, "report": "/gone", "verdict": "promote"})
    target.status = lambda: TargetStatus(  # type: ignore[method-assign]
        target="recording", stable=SlotStatus(slot="stable", release=stable, state="ready"),
        candidate=SlotStatus(slot="candidate", release=target.candidate), last_good=stable)
    edit(overlay, slo__vs_stable=vs_stable, validation__load=[
        {"profile": "balanced", "concurrency": 2, "requests": 8, "warmup_requests": 1}])
    rendered = steps.load_release(str(overlay), None)
    target.candidate = steps.record_of(rendered, "next").model_copy(update={"colour": "green"})
    target.asked.clear()
    target.baselines.clear()
    target.stable_record = stable
    return target, rendered


def served(srv) -> int:
    return len(srv.timings)


def test_the_baseline_is_measured_in_paired_blocks_and_a_slower_candidate_fails(
        server, faster_stable, user_facing, overlay, tmp_path, monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, rendered = slots(server, faster_stable, user_facing, overlay, tmp_path, {"ttft_p90": 1.5, "blocks": 2})
    logs: list[str] = []
    (tmp_path / "v").mkdir()
    users_before = served(user_facing)
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", logs.append, digest=target.candidate.digest)
    # the baseline of the stable release was started, used and stopped; the user-facing slot got nothing
    assert target.baselines == [("started", target.stable_record.digest), ("stopped", target.stable_record.digest)]
    assert "stable" not in target.asked and served(user_facing) == users_before
    assert any("candidate and baseline in 2 block pairs, random order" in m for m in logs), logs
    (stab,) = result.stable_benches
    assert stab.requests_ok == 8 and stab.interleaved.order in ("CSSC", "SCCS") and stab.interleaved.pairs == 2
    assert stab.samples.block == [0] * 4 + [1] * 4 and stab.load.ramp_s == 1.0 and stab.load.warmup == 1
    assert result.benches[0].samples.block == [0] * 4 + [1] * 4
    assert stab.base_url == faster_stable.base_url and stab.interleaved.void == []
    assert (tmp_path / "v" / "stable-bench-0-balanced.json").exists()
    failed = [c.check for c in result.decision.checks if not c.ok]
    # the recorded baseline (the candidate's own speed) would pass; the baseline measured now is 10x faster
    assert failed == ["vs_stable_ttft_p90"], result.decision.reasons


@pytest.mark.parametrize("without", ["fail", "absolute_only"])
def test_no_baseline_fails_vs_stable_closed_or_skips_it_when_the_spec_says_so(
        server, faster_stable, user_facing, overlay, tmp_path, monkeypatch, without):
    """The recorded baseline (another day's) is not used in its place: nothing was compared."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, rendered = slots(server, faster_stable, user_facing, overlay, tmp_path,
                             {"ttft_p90": 1.5, "blocks": 2, "without_baseline": without}, skip="no room for 2 pods")
    (tmp_path / "v").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", lambda m: None, digest=target.candidate.digest)
    (vs,) = [c for c in result.decision.checks if c.check == "vs_stable"]
    assert "no baseline could run: no room for 2 pods" in vs.message and result.stable_benches == []
    assert "stable" not in target.asked
    assert (vs.ok, result.decision.verdict) == ((False, "rollback") if without == "fail" else (True, "promote"))


def test_recorded_measure_keeps_the_baseline_and_starts_none(
        server, faster_stable, user_facing, overlay, tmp_path, monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, rendered = slots(server, faster_stable, user_facing, overlay, tmp_path,
                             {"ttft_p90": 1.5, "measure": "recorded"})
    (tmp_path / "v").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", lambda m: None, digest=target.candidate.digest)
    assert "stable" not in target.asked and result.stable_benches is None and target.baselines == []
    assert not [c for c in result.decision.checks if not c.ok], result.decision.reasons


def test_foreign_requests_on_the_baseline_void_the_block(faster_stable):
    """Someone else's requests reach the baseline while a block runs: its engines count more requests
    in the window than the benchmark sent, so the block (and its pair) cannot count."""
    from validation import profiles
    from validation.bench import BenchConfig, run_bench

    def intruder():
        time.sleep(0.3)
        body = json.dumps({"model": "pdops-tiny", "prompt": "x", "max_tokens": 4, "stream": True}).encode()
        for _ in range(3):
            req = urllib.request.Request(faster_stable.base_url + "/completions", body,  # noqa: S310 - 127.0.0.1
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()  # noqa: S310 - 127.0.0.1

    ep = endpoint(faster_stable)
    quiet = run_bench(BenchConfig(ep.base_url, "pdops-tiny", profiles.get("balanced"), concurrency=1, requests=6,
                                  metrics_url=ep.metrics_url))
    assert interleave.foreign_requests(quiet) is None
    thread = threading.Thread(target=intruder)
    thread.start()
    busy = run_bench(BenchConfig(ep.base_url, "pdops-tiny", profiles.get("balanced"), concurrency=1, requests=30,
                                 metrics_url=ep.metrics_url))
    thread.join()
    why = interleave.foreign_requests(busy)
    assert why is not None and "3 were not ours" in why and "sent 30" in why
    blind = busy.model_copy(update={"server": None})
    assert "could not be read" in interleave.foreign_requests(blind)   # unverifiable: fails closed


def live_with_a_starved_client(server, faster_stable, user_facing, overlay, tmp_path, monkeypatch, stalled):
    """Validate a candidate against its live baseline in 2 block pairs with slo.client_health: required, the client
    stalled in the runs numbered `stalled` (tests/fakes/starved_client.py); (the validation, the runs' count file).
    The client-lag limit is lifted so that only the injected stall voids a run."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target, _ = slots(server, faster_stable, user_facing, overlay, tmp_path, {"ttft_p90": 1.5, "blocks": 2})
    # no warm-up: a warm-up is a run of its own whose client health is not judged, so each block is one run
    edit(overlay, slo__client_health="required", validation__load=[
        {"profile": "balanced", "concurrency": 2, "requests": 8, "warmup_requests": 0}])
    rendered = steps.load_release(str(overlay), None)
    (tmp_path / "v").mkdir()
    runs = starve(monkeypatch, tmp_path, stalled)
    return steps.validate_slot(target, rendered.spec, tmp_path / "v", lambda m: None,
                               digest=target.candidate.digest), runs


@pytest.mark.parametrize("stalled", [1, 2])
def test_a_block_timed_by_a_starved_client_voids_its_pair_on_either_side(
        server, faster_stable, user_facing, overlay, tmp_path, monkeypatch, stalled):
    """slo.client_health: required. The client stalls in the first or second block of pair 0 (the order is
    seeded random, so either side): that pair is dropped with the reason, pair 1 is compared. A baseline timed
    by a starved client looks slower than it is: kept, every vs_stable ratio against it favours the candidate."""
    result, runs = live_with_a_starved_client(server, faster_stable, user_facing, overlay, tmp_path, monkeypatch,
                                              {stalled})
    (stab,) = result.stable_benches
    side = {"C": "candidate", "S": "stable"}[stab.interleaved.order[stalled - 1]]
    # no run of the whole load again: the pair went, not the load (after a void first block, the pair's
    # second is not run: validation/interleave.py measure)
    assert len(runs.read_text().splitlines()) == (3 if stalled == 1 else 4)
    (void,) = stab.interleaved.void
    assert (void.pair, void.side) == (0, side) and "the client was starved: " in void.reason, void
    cand = result.benches[0]
    assert stab.interleaved.pairs == 1 and stab.requests_ok == cand.requests_ok == 4
    assert not cand.client_health.client_bottleneck and cand.void_attempts == []
    assert not stab.client_health.client_bottleneck


def test_a_load_void_in_every_pair_is_measured_again_without_the_void_runs_baseline(
        server, faster_stable, user_facing, overlay, tmp_path, monkeypatch):
    """Every block of the first run of the load is void and so is the candidate's fallback run (AllVoid): the
    load runs again (slo.remeasure_void: 1) and the void run leaves nothing behind: not its baseline blocks, not
    its "every block pair was void" (which would fail vs_stable closed)."""
    result, runs = live_with_a_starved_client(server, faster_stable, user_facing, overlay, tmp_path, monkeypatch,
                                              {1, 2, 3})
    # each pair's first block void (its second not run), the candidate's fallback run void; then 2 pairs
    assert len(runs.read_text().splitlines()) == 7
    (stab,) = result.stable_benches
    assert stab.interleaved.pairs == 2 and stab.interleaved.first_block == 0 and stab.interleaved.void == []
    assert stab.requests_ok == 8 and result.benches[0].requests_ok == 8
    assert len(result.benches[0].void_attempts) == 1
    failed = [c.check for c in result.decision.checks if not c.ok]
    assert failed == ["vs_stable_ttft_p90"], result.decision.reasons   # compared: the baseline is 10x faster


def test_undo_forgets_what_a_thrown_away_run_of_a_load_left_in_the_baseline(tmp_path):
    """PairedLoads.mark/undo, as CandidateLoads.measure uses them around a void run: the baseline's blocks and
    the `missing` lines that run added go; what earlier looks and loads left stays."""
    from workflows.pipeline.paired import PairedLoads

    paired = PairedLoads(lambda: nullcontext(Skipped("none")), None, None, 2, lambda m: None,  # type: ignore[arg-type]
                         lambda p, o: None, tmp_path)
    earlier, void_run = object(), object()
    paired.stable[0], paired.missing[:] = earlier, ["load #1 balanced: no baseline could run"]
    mark = paired.mark(0)
    paired.stable[0] = void_run
    paired.missing.append("load #0 balanced: every block pair was void")
    paired.undo(0, mark)
    assert paired.stable == {0: earlier} and paired.missing == ["load #1 balanced: no baseline could run"]
    mark = paired.mark(2)
    paired.stable[2] = void_run
    paired.undo(2, mark)
    assert 2 not in paired.stable
