"""Interim looks that stop a load's measurement on a failure beyond doubt (slo.statistics.stop_early;
validation/interim.py, judge.budget, validation/interleave.py, validation/loadgen.py).

Block-level tests run validation/interleave.py on a synthetic block runner (no servers); the load measured
alone runs the real harness against a known-timing fake engine.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import canary, gate, interim, interleave, judge, profiles
from validation.bench import BenchConfig, run_bench
from validation.config import SLO, DecodeSLO, LoadProfile, PrefillSLO, Statistics
from validation.metrics import summary
from validation.reports.decision import Check, Decision

COMPAT = {"ok": True, "passed": 1, "required_failures": [], "cases": []}
# dev's absolute checks (overlays/dev/release.yaml): five quantiles and a 1 % error tolerance
DEV = SLO(prefill=PrefillSLO(ttft_p90_ms=1500, ttft_p99_ms=3000),
          decode=DecodeSLO(itl_p90_ms=60, tpot_p90_ms=50, tpot_p99_ms=100), max_error_rate=0.01,
          kv_transfer="ignored")
OFF = DEV.model_copy(update={"statistics": Statistics(stop_early=False)})


def block_runner(itl_ms, calls: list, tokens: int = 16, ttft_ms: float = 200.0, seed: int = 0, errors=lambda k: 0):
    """A candidate (and baseline) whose block k has ITL gaps drawn around `itl_ms(side, k)` ms: lognormal
    request-to-request spread 0.2, a block-level scale of 5 %, gap spread 0.1; `errors(k)` failed requests."""
    rng = np.random.default_rng(seed)

    def run(side, n, dur, warmup, k):
        calls.append((side, k))
        block = math.exp(rng.normal(0, 0.05))
        speed = itl_ms(side, k) * block * np.exp(rng.normal(0, 0.2, (n, 1)))
        per = speed * np.exp(rng.normal(0, 0.1, (n, tokens - 1)))       # each request's gaps
        gaps, tpot = per.ravel().tolist(), per.mean(axis=1).tolist()
        ttft = (ttft_ms * block * np.exp(rng.normal(0, 0.2, n))).tolist()
        bad = errors(k) if side == "candidate" else 0
        ok = n - bad
        return {"profile": "balanced", "load": {"mode": "closed", "concurrency": 16}, "itl_level": "token",
                "requests_total": n, "requests_ok": ok, "errors": bad, "error_rate": bad / n, "wall_s": 1.0,
                "client_health": {"client_bottleneck": False, "reasons": []},
                "ttft_ms": summary(ttft[:ok]), "tpot_ms": summary(tpot[:ok]), "itl_ms": summary(gaps[:ok * (tokens - 1)]),
                "samples": {"ttft": ttft[:ok], "tpot": tpot[:ok], "itl": gaps[:ok * (tokens - 1)],
                            "itl_counts": [tokens - 1] * ok, "outcomes": [1] * ok + [0] * bad}}
    return run


def measured(slo: SLO, itl_ms, requests: int = 1600, blocks: int = 16, seed: int = 0, errors=lambda k: 0):
    calls: list = []
    st = interim.stops(slo, 1, requests)
    cand, stab = interleave.measure(block_runner(itl_ms, calls, seed=seed, errors=errors), requests, None, 0, blocks,
                                    seed=seed, stop=st.blocks if st is not None else None)
    return cand, stab, calls


def decided(slo: SLO, cand, stab=None):
    return gate.decide(COMPAT, [cand], slo, [stab] if stab is not None else None,
                       planned=[LoadProfile(profile="balanced", concurrency=16, requests=1600)])


# ---- the budget -----------------------------------------------------------------------------------------
def test_the_interim_looks_spend_their_share_and_the_final_checks_the_rest():
    on, off = judge.budget(DEV, 1), judge.budget(OFF, 1)
    assert off.interim_tests == 0 and off.interim_alpha == 0 and off.alpha == pytest.approx(0.05 / 6)
    # 5 absolute checks + the error tolerance, 3 looks each: 18 interim tests
    assert on.interim_tests == 6 * len(judge.INTERIM_LOOKS) == 18
    assert on.alpha == pytest.approx(0.05 * (1 - judge.INTERIM_SHARE) / 6)
    assert on.interim_alpha == pytest.approx(0.05 * judge.INTERIM_SHARE / 18) and on.interim_alpha < 0.001
    # the union bound: every final check at alpha plus every interim test at its level is the budget
    assert on.checks * on.alpha + on.interim_tests * on.interim_alpha == pytest.approx(0.05)
    assert "interim tests" in on.text()
    # a looser budget is capped at Haybittle-Peto's 0.001
    one = SLO(decode=DecodeSLO(itl_p90_ms=60), kv_transfer="ignored", statistics=Statistics(false_rollback=0.5))
    assert judge.budget(one, 1).interim_alpha == judge.HAYBITTLE_PETO
    assert interim.points(1600) == [200, 400, 800] and interim.points(16) == [2, 4, 8] and interim.points(4) == [2]
    assert interim.points(2) == [] and interim.points(8) == [2, 4]


# ---- a clearly failing candidate stops ------------------------------------------------------------------
def test_a_clearly_failing_candidate_stops_after_the_first_look_in_blocks_and_rolls_back():
    cand, stab, calls = measured(DEV, lambda side, k: 120.0 if side == "candidate" else 20.0)   # 2x the ITL SLO
    # the look after 2 blocks has one degree of freedom (t(1) at p < 2.8e-5 is about 11,000): it cannot stop;
    # the look after 4 blocks (t(3)) does: a quarter of the plan measured
    assert len(calls) == 2 * 4 and cand.interleaved.pairs == 4 and stab.interleaved.pairs == 4
    se = cand.stopped_early
    assert se is not None and se.block == 4 and se.blocks == 16 and se.after == 400 and se.planned == 1600
    assert "itl_p90_ms" in se.checks and se.level == judge.budget(DEV, 1).interim_alpha
    assert se.reason.startswith("stopped early after 400 of 1600 requests (block 4 of 16): ")
    assert "lower bound" in se.reason and "> SLO 60 ms" in se.reason and f"at p < {se.level:.2g}" in se.reason
    d = decided(DEV, cand)
    assert d.verdict == "rollback"
    stop = d.named("stopped_early")[0]
    assert not stop.ok and stop.message.endswith(se.reason) and d.reasons[0] == stop.message
    assert d.named("loads")[0].ok


def test_a_clearly_failing_candidate_measured_alone_stops_and_the_report_says_so():
    srv = KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.012, tokens=8).start()
    try:
        slo = DEV.model_copy(update={"decode": DecodeSLO(itl_p90_ms=6, tpot_p90_ms=6, tpot_p99_ms=10)})  # 2x over
        st = interim.stops(slo, 1, 400)
        assert st is not None
        b = run_bench(BenchConfig(srv.base_url, "fake-model", profiles.get("balanced"), concurrency=8,
                                  requests=400, warmup=1, isolate=True, stop=st.alone))
    finally:
        srv.stop()
    se = b.stopped_early
    assert se is not None and se.planned == 400 and se.after in interim.points(400) and se.block is None
    assert (b.requests_total or 0) < 400 - 100      # stopped: at most the requests in flight finished after it
    assert se.reason.startswith(f"stopped early after {se.after} of 400 requests: ")
    d = gate.decide(COMPAT, [b], slo, planned=[LoadProfile(profile="balanced", concurrency=8, requests=400)])
    assert d.verdict == "rollback" and d.reasons[0].endswith(se.reason)


# ---- an A/A candidate at the SLO never stops ------------------------------------------------------------
def test_a_candidate_exactly_at_the_slo_never_stops_early_across_many_seeds(monkeypatch):
    """The worst case for a false stop: the candidate's true ITL p90 exactly at the limit (lognormal request
    speeds, gap spread, 5 % block noise). Counted over 150 seeds x 3 looks: none stops. A look at the final
    checks' level would stop about alpha of the time at each look (checked: at 5 % it does)."""
    tokens, spread = 16, 0.2
    # the p90 of the gaps: request speeds lognormal(0.2) x gaps lognormal(0.1) x block lognormal(0.05)
    z90 = 1.2815515655446004
    limit = 20.0 * math.exp(z90 * math.sqrt(spread ** 2 + 0.1 ** 2 + 0.05 ** 2))
    slo = SLO(decode=DecodeSLO(itl_p90_ms=round(limit, 2)), max_error_rate=0.01, kv_transfer="ignored")
    bud = judge.budget(slo, 1)
    monkeypatch.setattr(judge, "HAYBITTLE_PETO", 1.0)   # uncapped, for the contrast at p < 0.05 only
    at_05 = judge.Budget(5.0, 0.05, 1, 1, 1, 1)          # interim_alpha: 5.0 x INTERIM_SHARE / 1 = 0.05
    assert bud.interim_alpha < 0.001 and at_05.interim_alpha == pytest.approx(0.05)
    stops = loose = 0
    for seed in range(150):
        calls: list = []
        run = block_runner(lambda side, k: 20.0, calls, tokens=tokens, seed=seed)
        blocks = [interleave.labelled(interleave.BenchReport.coerce(run("candidate", 100, None, 0, k)), k)
                  for k in range(8)]
        for k in interim.points(16):
            so_far = interleave.merged(blocks[:k])
            stops += bool(interim.look(so_far, slo, bud))
            loose += bool(interim.look(so_far, slo, at_05))
    print(f"A/A at the SLO: {stops} interim stops in {150 * len(interim.points(16))} looks "
          f"(p < {bud.interim_alpha:.2g}); at p < 0.05: {loose}")
    assert stops == 0
    assert loose > 0    # the same data at a loose level does stop: the test can see a wrong level


# ---- a candidate failing only at the end ----------------------------------------------------------------
def test_a_candidate_failing_only_after_the_looks_runs_the_whole_plan_and_rolls_back_at_the_final_look():
    # blocks 0-7 fine (20 ms), 8-15 at 3x the limit: every look (after blocks 2, 4, 8) sees a healthy candidate
    cand, stab, calls = measured(DEV, lambda side, k: 180.0 if side == "candidate" and k >= 8 else 20.0)
    assert cand.stopped_early is None and len(calls) == 32 and cand.interleaved.pairs == 16
    d = decided(DEV, cand)
    assert d.verdict == "rollback" and not d.named("stopped_early")
    assert not d.named("itl_p90_ms")[0].ok and d.named("itl_p90_ms")[0].verdict == "fail"


def test_errors_beyond_the_tolerance_stop_and_zero_tolerance_stops_on_the_first_error():
    cand, _, calls = measured(DEV, lambda side, k: 20.0, errors=lambda k: 30)   # 30 % errors vs 1 %
    assert cand.stopped_early is not None and cand.stopped_early.checks == ["error_rate"] and len(calls) == 4
    assert "Clopper-Pearson" in cand.stopped_early.reason
    zero = DEV.model_copy(update={"max_error_rate": 0.0})
    cand, _, calls = measured(zero, lambda side, k: 20.0, errors=lambda k: 1 if k == 3 else 0)
    assert cand.stopped_early is not None and cand.stopped_early.block == 4 and "zero tolerance" in \
        cand.stopped_early.reason


# ---- stop_early: false ----------------------------------------------------------------------------------
def test_stop_early_false_runs_the_whole_plan():
    assert interim.stops(OFF, 1, 1600) is None
    cand, _, calls = measured(OFF, lambda side, k: 120.0 if side == "candidate" else 20.0)
    assert cand.stopped_early is None and len(calls) == 32 and cand.interleaved.pairs == 16
    d = decided(OFF, cand)
    assert d.verdict == "rollback" and not d.named("stopped_early") and not d.named("itl_p90_ms")[0].ok


# ---- the rest of the release ----------------------------------------------------------------------------
def test_the_loads_after_an_early_stop_are_not_measured_and_not_a_second_failure():
    cand, _, _ = measured(DEV, lambda side, k: 120.0)
    two = [LoadProfile(profile="balanced", concurrency=16, requests=1600),
           LoadProfile(profile="balanced", concurrency=32, requests=1600)]
    loads = gate.decide(COMPAT, [cand], DEV, planned=two).named("loads")[0]
    assert loads.ok and "not measured: balanced c=32, since balanced c=16 stopped early" in loads.message
    cand.stopped_early = None    # without the stop, a missing load still fails
    assert not gate.decide(COMPAT, [cand], DEV, planned=two).named("loads")[0].ok


def test_the_canary_classifies_the_checks_that_stopped_the_run_not_the_stop_itself():
    stop = Check(check="stopped_early", ok=False, message="stopped early ...", value=200, limit=1600)
    near = Check(check="itl_p90_ms", ok=False, message="1.3x", value=78.0, limit=60.0)
    gross = Check(check="itl_p90_ms", ok=False, message="2x", value=121.0, limit=60.0)
    assert canary.hard_failures(Decision(verdict="rollback", reasons=[], checks=[stop, near])) == []
    assert canary.hard_failures(Decision(verdict="rollback", reasons=[], checks=[stop, gross])) == [gross]


# ---- the setting in release.yaml ------------------------------------------------------------------------
def test_release_yaml_turns_it_off_and_a_bad_value_names_the_field():
    from pathlib import Path

    from validation.errors import InputError
    from validation.yaml_input import read_yaml_file
    from workflows.spec.release import parse_spec

    dev = Path(__file__).resolve().parents[2] / "overlays" / "dev" / "release.yaml"
    data = read_yaml_file(dev)
    assert parse_spec(data, dev).slo.statistics.stop_early is True          # on by default
    data["slo"]["statistics"] = {"stop_early": False}
    spec = parse_spec(data, dev)
    assert spec.slo.statistics.stop_early is False and interim.stops(spec.slo, 1, 1600) is None
    data["slo"]["statistics"] = {"stop_early": "sometimes"}
    with pytest.raises(InputError) as exc:
        parse_spec(data, dev)
    assert exc.value.field == "slo.statistics.stop_early"
