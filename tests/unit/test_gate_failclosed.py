"""Issue 21's fail-open paths never promote, through `pdops gate` (what users and CI run) and through
`validation.gate.decide` in-process (what a release calls); and the exact error tests are pinned
against published values.

Each synthetic report is what `pdops bench --json` writes, then broken in one field.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import error_rates, gate_inputs, judge, metrics, profiles
from validation.bench import BenchConfig, run_bench
from validation.config import SLO, LoadProfile, PrefillSLO, VsStable
from validation.gate import decide
from validation.reports.bench import BenchReport
from workflows.cli.main import main  # pdops: bad input (InputError) exits 2 naming the file

COMPAT = {"ok": True, "passed": 1, "required_failures": [], "cases": []}
LOADS = [{"profile": "balanced", "concurrency": c, "requests": 300} for c in (16, 32, 64)]
PLANNED = [LoadProfile.model_validate(x) for x in LOADS]


def bench(scale=1.0, c=16, n=300, errors=0, seed=0, blocks=None):
    """A bench report as `pdops bench --json` writes it: counts, samples, client health; with `blocks`,
    an interleaved run's block of each successful request (consecutive blocks)."""
    rng = np.random.default_rng(seed)
    ttft = (100 * scale * rng.lognormal(0, 0.3, n - errors)).round(3).tolist()
    tpot = (10 * scale * rng.lognormal(0, 0.2, n - errors)).round(3).tolist()
    block = {"block": [i * blocks // (n - errors) for i in range(n - errors)]} if blocks else {}
    return {"kind": "bench", "profile": "balanced", "load": {"mode": "closed", "concurrency": c},
            "requests_total": n, "requests_ok": n - errors, "errors": errors, "error_rate": errors / n,
            "itl_level": "token", "ttft_ms": metrics.summary(ttft), "tpot_ms": metrics.summary(tpot),
            "itl_ms": metrics.summary(tpot),
            "client_health": {"loop_lag_ms": {"p50": 1.0, "p99": 3.0, "max": 5.0, "samples": 100},
                              "cpu_percent": {"mean": 20.0, "max": 40.0, "samples": 10},
                              "client_bottleneck": False, "reasons": []},
            "samples": {"ttft": ttft, "tpot": tpot, **block}}


def release_yaml(folder, without_baseline=None, max_error_rate=0.01, loads=LOADS):
    vs = {"ttft_p90": 1.1, "tpot_p90": 1.1, **({"without_baseline": without_baseline} if without_baseline else {})}
    spec = {"name": "pd-llm", "model": {"id": "m", "source": "s"},
            "slo": {"prefill": {"ttft_p90_ms": 1000}, "decode": {"tpot_p90_ms": 100}, "kv_transfer": "ignored",
                    "max_error_rate": max_error_rate, "vs_stable": vs},
            "validation": {"load": loads}}
    (folder / "env").mkdir(exist_ok=True)
    (folder / "env" / "release.yaml").write_text(json.dumps(spec))   # JSON is YAML
    return folder / "env" / "release.yaml"


def gate(tmp_path, benches, stable=None, **spec):
    """`pdops gate` on these reports: (exit code, decision JSON or None)."""
    (tmp_path / "compat.json").write_text(json.dumps(COMPAT))
    (tmp_path / "bench.json").write_text(json.dumps(benches))   # NaN written as NaN, as Python's json does
    args = ["gate", "--compat", str(tmp_path / "compat.json"), "--bench", str(tmp_path / "bench.json"),
            "--release", str(release_yaml(tmp_path, **spec)), "--out", str(tmp_path / "out"),
            "--json", str(tmp_path / "decision.json")]
    if stable is not None:
        (tmp_path / "stable.json").write_text(json.dumps(stable))
        args += ["--stable-report", str(tmp_path / "stable.json")]
    code = main(args)
    return code, json.loads((tmp_path / "decision.json").read_text()) if code in (0, 1) else None


def three(scale=1.0, first=None):
    return [first or bench(scale, 16, seed=1), bench(scale, 32, seed=2), bench(scale, 64, seed=3)]


def slo(**vs):
    return SLO(prefill=PrefillSLO(ttft_p90_ms=1000), kv_transfer="ignored", max_error_rate=0.01,
               vs_stable=VsStable(ttft_p90=1.1, tpot_p90=1.1, **vs))


# ---- 1. no baseline, or none at the same load -------------------------------------------------------
def test_a_candidate_1_9x_slower_with_no_baseline_is_not_promoted(tmp_path):
    code, d = gate(tmp_path, three(1.9))
    assert code == 1 and d["verdict"] == "rollback"
    assert d["reasons"][0].startswith("vs_stable not proven: no baseline run was given")
    assert "without_baseline: absolute_only" in d["reasons"][0]   # the fix is named


def test_a_baseline_at_another_load_compares_with_nothing_and_fails(tmp_path):
    code, d = gate(tmp_path, three(1.9), stable=[bench(1.0, 128, seed=9)])
    assert code == 1
    assert [c["bench"] for c in d["checks"] if c["check"] == "vs_stable" and not c["ok"]] == [
        "#0 balanced c=16", "#1 balanced c=32", "#2 balanced c=64"]
    assert "no valid baseline run at balanced c=16 (baseline runs: balanced c=128)" in d["reasons"][0]


def test_absolute_only_promotes_on_absolute_slos_and_says_so_first(tmp_path):
    code, d = gate(tmp_path, three(1.9), without_baseline="absolute_only")
    assert code == 0 and d["verdict"] == "promote"
    assert d["reasons"][0] == d["scope"] == ("gated on absolute SLOs only: no baseline run was given (a first "
                                             "release, or no room for a baseline)")
    assert [c["verdict"] for c in d["checks"] if c["check"] == "vs_stable"] == ["skipped"]
    # absolute SLOs still gate: 15x slower breaks ttft_p90_ms 1000
    code, d = gate(tmp_path, three(15.0), without_baseline="absolute_only")
    assert code == 1 and d["reasons"][0].startswith("gated on absolute SLOs only")
    assert any(c["check"] == "ttft_p90_ms" and not c["ok"] for c in d["checks"])


def test_with_a_baseline_at_every_load_the_comparison_decides(tmp_path):
    """Interleaved runs of 1600 requests in 32 blocks a side (the default plan): block k of the candidate
    is compared with block k of the baseline (validation/judge.py)."""
    stable = [bench(1.0, c, n=1600, seed=11 + k, blocks=32) for k, c in enumerate((16, 32, 64))]
    same = [bench(1.0, c, n=1600, seed=1 + k, blocks=32) for k, c in enumerate((16, 32, 64))]
    code, d = gate(tmp_path, same, stable=stable)
    assert code == 0, d["reasons"]
    vs = [c for c in d["checks"] if c["check"].startswith("vs_stable_")]
    assert len(vs) == 6 and all(c["verdict"] == "pass" and "32 block pairs" in c["message"] for c in vs)
    # each states its interval, what it can detect and the budget share it spent: 5 % over 3 loads x
    # (ttft_p90_ms, tpot_p90_ms, 2 vs_stable, error_rate, errors_vs_baseline), less the interim looks' share
    # (slo.statistics.stop_early, judge.INTERIM_SHARE)
    assert all(c["alpha"] == pytest.approx(0.05 * (1 - judge.INTERIM_SHARE) / 18) and c["interval"][0] < 1
               for c in vs)
    assert all(c["detectable"]["rolled_back_from"] < 1.1 ** 3 for c in vs)
    slower = [bench(1.9, c, n=1600, seed=1 + k, blocks=32) for k, c in enumerate((16, 32, 64))]
    code, d = gate(tmp_path, slower, stable=stable)
    assert code == 1 and {c["check"] for c in d["checks"] if not c["ok"]} == {"vs_stable_ttft_p90",
                                                                              "vs_stable_tpot_p90"}
    assert {c["verdict"] for c in d["checks"] if not c["ok"]} == {"fail"}     # proven beyond 1.1x


def test_one_block_pair_has_no_interval_and_fails_closed():
    """A baseline measured in one block (not interleaved): nothing estimates block-to-block noise, so the
    comparison is inconclusive and, by default, not promoted, saying how to fix it."""
    stable = [bench(1.0, c, seed=11 + k) for k, c in enumerate((16, 32, 64))]
    d = decide(COMPAT, three(1.0), slo(), stable, planned=PLANNED)
    vs = [c for c in d.checks if c.check.startswith("vs_stable_")]
    assert d.verdict == "rollback" and {c.verdict for c in vs} == {"inconclusive"} and not any(c.ok for c in vs)
    assert "1 block pair (one block): no block-level variance" in vs[0].message
    assert "raise slo.vs_stable.blocks" in vs[0].message


# ---- 2. input the gate refuses to judge: exit 2 with file, field and fix; decide(): a failing check ----
def _null_errors(b):
    b.update(errors=None, error_rate=None)


def _contradicting_rate(b):   # the case: 26 of 526 failed, error_rate 0.0
    b.update(bench(n=526, errors=26, seed=1), error_rate=0.0)


def _nan_sample(b):
    b["samples"]["ttft"][5] = math.nan


def _zero_ttft(b):
    b["samples"]["ttft"][5] = 0.0


def _no_client_health(b):
    del b["client_health"]


def _counts_do_not_add_up(b):
    b["requests_total"] = 290


def _negative_tpot(b):
    b["samples"]["tpot"][0] = -1.0


def _outcomes_contradict_counts(b):
    b["samples"]["outcomes"] = [1] * 299 + [0]


@pytest.mark.parametrize("breaks, field, words", [
    (_null_errors, "errors", "null or missing"),
    (_contradicting_rate, "error_rate", "0.0 contradicts the counts (26 errors in 526 requests is 4.9430%)"),
    (_nan_sample, "samples.ttft.5", "nan ms is not a finite latency > 0"),
    (_zero_ttft, "samples.ttft.5", "0.0 ms is not a finite latency > 0"),
    (_no_client_health, "client_health.client_bottleneck", "nothing says the load generator kept up"),
    (_counts_do_not_add_up, "requests_total", "requests_ok 300 + errors 0 != requests_total 290"),
    (_negative_tpot, "samples.tpot.0", "-1.0 ms is not a finite latency > 0"),
    (_outcomes_contradict_counts, "samples.outcomes", "1 errors in 300 requests contradict"),
])
def test_unjudgeable_reports_are_bad_input_never_a_verdict(tmp_path, capsys, breaks, field, words):
    first = bench(1.0, 16, seed=1)
    breaks(first)
    code, _ = gate(tmp_path, three(first=first))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {tmp_path / 'bench.json'}: [0].{field}: ") and words in err, err
    assert "\n  fix: " in err and not (tmp_path / "out").exists()     # nothing written half way
    # the same report in-process (a release): a failing check with the same message, no exception
    d = decide(COMPAT, three(first=first), slo(without_baseline="absolute_only"), None, planned=PLANNED)
    bad = [c for c in d.checks if c.check == "report_input"]
    assert d.verdict == "rollback" and bad and bad[0].message.startswith(f"#0 balanced c=16: {field}: ")
    assert words in bad[0].message and "; fix: " in bad[0].message
    # the broken bench's own checks are not judged (no point estimate stands in for its samples)
    assert not [c for c in d.checks if c.bench == "#0 balanced c=16" and c.check != "report_input"]


def test_an_unjudgeable_baseline_file_is_bad_input_too(tmp_path, capsys):
    base = bench(1.0, 16, seed=11)
    base["samples"]["tpot"][3] = math.inf
    code, _ = gate(tmp_path, three(), stable=[base])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {tmp_path / 'stable.json'}: samples.tpot.3: inf ms"), err


def test_in_process_a_bad_baseline_fails_and_is_not_compared_with():
    base = bench(1.0, 16, seed=11)
    base["errors"] = None
    d = decide(COMPAT, [bench(1.0, 16, seed=1)], slo(), [base])
    assert d.verdict == "rollback"
    assert [c.message.split(":")[0] for c in d.checks if not c.ok] == ["baseline #0 balanced c=16",
                                                                       "#0 balanced c=16"]
    assert "no valid baseline run at balanced c=16 (baseline runs: none valid)" in d.reasons[1]


def test_zero_itl_gaps_are_real_readings_and_accepted():
    b = bench()
    b["samples"].update(itl=[0.0, 5.0, 0.0], itl_counts=[2, 1] + [0] * 298)
    assert gate_inputs.problems(BenchReport.model_validate(b)) == []


def test_what_the_bench_writes_passes_the_input_checks_and_counts_every_request():
    """The real harness against the known-timing fake answering at once: the report is judgeable
    (no 0 ms TPOT: the client saw every token in one read, so TPOT is null), and `samples.outcomes`
    has one entry per measured request."""
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.0, tokens=8) as srv:
        b = run_bench(BenchConfig(srv.base_url, srv.model, profiles.get("balanced"), concurrency=2, requests=40, seed=0))
    assert gate_inputs.problems(b) == []
    assert b.samples.outcomes == [1] * 40 and min(b.samples.ttft) > 0 and not b.samples.tpot


def test_outcomes_are_in_send_order_and_count_errors():
    ok = {"warmup": False, "status": 200, "error": None, "first_content": 0.1, "chunk_times": [0.1, 0.2],
          "last_chunk": 0.2, "usage": {"completion_tokens": 2}}
    recs = [{**ok, "sent": 0.3}, {**ok, "sent": 0.0, "status": 500, "first_content": None},
            {**ok, "sent": 0.1, "warmup": True}, {**ok, "sent": 0.2}]
    assert metrics.samples(recs)["outcomes"] == [0, 1, 1]
    assert metrics.per_request({**ok, "sent": 0.0, "last_chunk": 0.1})["tpot"] is None   # all at once: null


# ---- 3. errors as counts -----------------------------------------------------------------------------
def test_one_error_at_the_planned_n_does_not_trip_a_nonzero_tolerance(tmp_path):
    code, d = gate(tmp_path, three(first=bench(1.0, 16, errors=1, seed=1)),
                   without_baseline="absolute_only", max_error_rate=0.001)
    check = next(c for c in d["checks"] if c["check"] == "error_rate" and c["bench"] == "#0 balanced c=16")
    assert code == 0 and check["ok"] and check["verdict"] == "pass"
    assert "1 error in 300 requests" in check["message"]
    # the test runs at its share of the decision's 5 % false-rollback budget: 3 loads x (ttft_p90_ms,
    # tpot_p90_ms, 2 vs_stable, error_rate, errors_vs_baseline) = 18 checks (validation/judge.py budget), less
    # the interim looks' share (slo.statistics.stop_early)
    alpha = 0.05 * (1 - judge.INTERIM_SHARE) / 18
    assert check["alpha"] == pytest.approx(alpha)
    assert "at n=300, 4 errors (1.33%) roll back" in check["message"]   # the smallest count that trips it
    assert check["interval"][0] == pytest.approx(1 - (1 - alpha) ** (1 / 300))
    code, d = gate(tmp_path, three(first=bench(1.0, 16, errors=4, seed=1)),
                   without_baseline="absolute_only", max_error_rate=0.001)
    assert code == 1 and "proven above the tolerance" in d["reasons"][1]


def test_zero_tolerance_means_any_error_rolls_back(tmp_path):
    code, d = gate(tmp_path, three(first=bench(1.0, 16, errors=1, seed=1)),
                   without_baseline="absolute_only", max_error_rate=0)
    assert code == 1 and "max_error_rate 0 is zero tolerance: any error rolls back" in d["reasons"][1]


def test_the_summary_rate_is_never_read_counts_come_from_outcomes():
    b = bench(1.0, 16, errors=30, seed=1)
    b["samples"]["outcomes"] = [1] * 270 + [0] * 30
    b["error_rate"] = None
    d = decide(COMPAT, [b], slo(without_baseline="absolute_only"), planned=PLANNED[:1])
    check = d.named("error_rate")[0]
    assert not check.ok and "30 errors in 300 requests (from per-request outcomes)" in check.message


def test_more_errors_than_the_baseline_at_the_same_load_roll_back():
    """Fisher's exact test: 8 of 300 vs 0 of 300 is within a 5 % tolerance, but significantly worse than
    the baseline (p = C(300,8)/C(600,8) = 0.0038)."""
    lenient = slo().model_copy(update={"max_error_rate": 0.05})
    d = decide(COMPAT, [bench(1.0, 16, errors=8, seed=1)], lenient, [bench(1.0, 16, seed=11)])
    assert d.named("error_rate")[0].ok
    fisher = d.named("errors_vs_baseline")[0]
    assert not fisher.ok and fisher.value == pytest.approx(math.comb(300, 8) / math.comb(600, 8))
    assert "the candidate fails more often than the baseline" in fisher.message
    same = decide(COMPAT, [bench(1.0, 16, errors=1, seed=1)], lenient, [bench(1.0, 16, errors=1, seed=11)])
    assert same.named("errors_vs_baseline")[0].ok


# ---- 4. the loads the release plans ------------------------------------------------------------------
def test_fewer_loads_than_planned_never_promote(tmp_path):
    code, d = gate(tmp_path, [bench(1.0, 16, seed=1)], without_baseline="absolute_only")
    assert code == 1
    assert "loads: 1 of 3 planned loads measured; missing: balanced c=32, balanced c=64" in d["reasons"][1]


def test_an_unplanned_load_fails_too():
    d = decide(COMPAT, three() + [bench(1.0, 128, seed=4)], slo(without_baseline="absolute_only"),
               planned=PLANNED)
    assert d.verdict == "rollback" and "not planned: balanced c=128" in d.named("loads")[0].message
    rate = LoadProfile(profile="balanced", rate=8, duration_s=120)
    b = bench()
    b["load"] = {"mode": "open", "concurrency": None, "rate": 8.0}
    assert decide(COMPAT, [b], slo(without_baseline="absolute_only"), planned=[rate]).named("loads")[0].ok


# ---- exact tests pinned against published values -----------------------------------------------------
def test_clopper_pearson_matches_r_binom_test():
    # R: binom.test(682, 925, p = 0.75) (its help page's example): 95 percent CI 0.7076683 0.7654066
    assert error_rates.lower_bound(682, 925, 0.975) == pytest.approx(0.7076683, abs=5e-8)
    assert 1 - error_rates.lower_bound(925 - 682, 925, 0.975) == pytest.approx(0.7654066, abs=5e-8)
    # closed forms: k = 1 solves 1 - (1 - p)^n = alpha; k = n solves p^n = alpha
    assert error_rates.lower_bound(1, 300, 0.95) == pytest.approx(1 - 0.95 ** (1 / 300), rel=1e-12)
    assert error_rates.lower_bound(10, 10, 0.95) == pytest.approx(0.05 ** 0.1, rel=1e-12)
    assert error_rates.lower_bound(0, 300, 0.95) == 0.0
    # R: 1 - pbinom(2, 10, 0.3) = 0.6172172
    assert error_rates.binomial_sf(3, 10, 0.3) == pytest.approx(0.6172172, abs=5e-8)


def test_fisher_matches_r_fisher_test():
    # R's help page: fisher.test(TeaTasting, alternative = "greater"): p-value = 0.2429 (= 17/70)
    assert error_rates.fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70, rel=1e-12)
    # fisher.test(Convictions, alternative = "less"): p-value = 0.0004652 (monozygotic 10 of 13
    # convicted vs dizygotic 2 of 17: "less" for dizygotic is "greater" for monozygotic)
    assert error_rates.fisher_greater(10, 13, 2, 17) == pytest.approx(0.0004652, abs=5e-8)
    # Wikipedia's dieting example, one-tailed: (C(12,9) C(12,1) + C(12,10)) / C(24,10) = 0.001380
    assert error_rates.fisher_greater(9, 12, 1, 12) == pytest.approx(2706 / 1961256, rel=1e-12)
    assert error_rates.fisher_greater(0, 300, 0, 300) == 1.0


def test_errors_to_fail_is_the_first_count_whose_bound_clears_the_tolerance():
    k = error_rates.errors_to_fail(500, 0.001, 0.95)
    assert error_rates.lower_bound(k, 500, 0.95) > 0.001 >= error_rates.lower_bound(k - 1, 500, 0.95)
    assert k == 3
    # with that rule the check is caught with power 95 % at this rate: P(X >= k) = 0.95
    p = error_rates.detectable_rate(500, k, 0.95)
    assert error_rates.binomial_sf(k, 500, p) == pytest.approx(0.95, abs=1e-9)
