"""Promote/rollback decisions and their reasons."""
from __future__ import annotations

from validation.config import SLO, DecodeSLO, PrefillSLO, VsStable
from validation.gate import decide

COMPAT_OK = {"ok": True, "passed": 19, "required_failures": [], "cases": []}


def s(p90, p99=None):
    return {"mean": p90, "p50": p90, "p90": p90, "p95": p90, "p99": p99 or p90, "max": p99 or p90}


def bench(ttft=(100, 150), itl=(10, 20), tpot=(10, 15), errors=0, ok=32, kv=500, nixl=0,
          bottleneck=False, goodput=5.0, attain=1.0, profile="balanced", c=4, server=True):
    b = {"kind": "bench", "profile": profile, "load": {"concurrency": c, "rate": None},
         "ttft_ms": s(*ttft), "itl_ms": s(*itl), "tpot_ms": s(*tpot), "e2e_ms": s(1000),
         "requests_total": ok + errors, "requests_ok": ok, "errors": errors,
         "error_rate": errors / (ok + errors) if ok + errors else None,
         "goodput_rps": goodput, "slo_attainment": attain,
         "client_health": {"client_bottleneck": bottleneck, "reasons": ["event-loop lag p99 40 ms > 10 ms"] if bottleneck else []}}
    if server:
        b["server"] = {"kv": {"external_kv_prompt_tokens": kv, "nixl_failed_transfers": nixl}}
    return b


SLO_ = SLO(prefill=PrefillSLO(ttft_p90_ms=200, ttft_p99_ms=300),
           decode=DecodeSLO(itl_p90_ms=30, itl_p99_ms=50, tpot_p90_ms=25, tpot_p99_ms=40),
           max_error_rate=0.01, min_goodput_rps=1.0, min_slo_attainment=0.9)


def failed(d):
    return {c.check for c in d.checks if not c.ok}


def test_promote_when_everything_meets():
    d = decide(COMPAT_OK, [bench(), bench(c=16)], SLO_, None)
    assert d.verdict == "promote", d.reasons
    checked = {c.check for c in d.checks}
    assert {"ttft_p90_ms", "ttft_p99_ms", "itl_p90_ms", "itl_p99_ms", "tpot_p90_ms", "tpot_p99_ms",
            "error_rate", "goodput_rps", "slo_attainment", "kv_transfer", "compat"} <= checked


def test_each_threshold_rolls_back():
    cases = {
        "ttft_p90_ms": bench(ttft=(250, 260)),
        "ttft_p99_ms": bench(ttft=(150, 400)),
        "itl_p90_ms": bench(itl=(35, 45)),
        "itl_p99_ms": bench(itl=(20, 60)),
        "tpot_p90_ms": bench(tpot=(26, 30)),
        "tpot_p99_ms": bench(tpot=(20, 45)),
        "error_rate": bench(errors=4, ok=28),   # 2 of 32 is not proven above 1 % at its 5 %/7 budget share
        "goodput_rps": bench(goodput=0.5),
        "slo_attainment": bench(attain=0.5),
        "kv_transfer": bench(kv=0),
        "nixl_failures": bench(nixl=3),
        "client_bottleneck": bench(bottleneck=True),
    }
    for name, b in cases.items():
        d = decide(COMPAT_OK, [b], SLO_, None)
        assert d.verdict == "rollback", name
        assert failed(d) == {name}, (name, d.reasons)


def test_compat_required_failure_rolls_back():
    d = decide({"ok": False, "required_failures": ["stream_done"]}, [bench()], SLO_, None)
    assert d.verdict == "rollback" and "stream_done" in d.reasons[0]


def test_missing_evidence_rolls_back():
    d = decide(COMPAT_OK, [bench(server=False)], SLO_, None)
    assert failed(d) == {"kv_transfer"} and "--metrics-url" in d.reasons[0]
    assert decide(COMPAT_OK, [], SLO_, None).verdict == "rollback"
    nodata = bench()
    nodata["ttft_ms"] = {"p90": None, "p99": None}
    assert "ttft_p90_ms" in failed(decide(COMPAT_OK, [nodata], SLO_, None))


def test_kv_ignored():
    slo = SLO_.model_copy(update={"kv_transfer": "ignored"})
    assert decide(COMPAT_OK, [bench(server=False)], slo, None).verdict == "promote"


def test_vs_stable_ratio():
    """Reports without per-request samples have no interval: inconclusive, so not promoted by default;
    `inconclusive: point_estimate` decides on the ratio of the reports' p90s."""
    from validation.config import Statistics
    strict = SLO_.model_copy(update={"vs_stable": VsStable(ttft_p90=1.2, tpot_p90=1.1)})
    stable = [bench(ttft=(100, 150), tpot=(10, 15))]
    d = decide(COMPAT_OK, [bench(ttft=(115, 150), tpot=(10.5, 15))], strict, stable)
    assert d.verdict == "rollback" and {c.verdict for c in d.checks if not c.ok} == {"inconclusive"}
    slo = strict.model_copy(update={"statistics": Statistics(inconclusive="point_estimate")})
    ok = decide(COMPAT_OK, [bench(ttft=(115, 150), tpot=(10.5, 15))], slo, stable)
    assert ok.verdict == "promote", ok.reasons
    bad = decide(COMPAT_OK, [bench(ttft=(130, 150), tpot=(10, 15))], slo, stable)
    assert failed(bad) == {"vs_stable_ttft_p90"} and "1.30x" in bad.reasons[0]
    # a baseline at another load level compares with nothing: not proven, so not promoted (issue 21:
    # this test enshrined a 1.9x slower candidate promoted at c=64); test_gate_failclosed.py has the rest
    other = decide(COMPAT_OK, [bench(ttft=(190, 200), c=64)], slo, stable)
    assert other.verdict == "rollback" and failed(other) == {"vs_stable"}
    assert "no valid baseline run at balanced c=64 (baseline runs: balanced c=4)" in other.reasons[0]


def test_client_health_can_be_reported_without_gating():
    from validation.config import SLO
    from validation.gate import decide

    starved = {"profile": "balanced", "load": {"concurrency": 2}, "requests_total": 4, "requests_ok": 4, "errors": 0,
               "client_health": {"client_bottleneck": True, "reasons": ["event-loop lag p99 500 ms > 10 ms"]}}
    compat = {"required_failures": [], "passed": 1}
    gated = decide(compat, [starved], SLO(kv_transfer="ignored"))
    reported = decide(compat, [starved], SLO(kv_transfer="ignored", client_health="ignored"))
    assert gated.verdict == "rollback" and "measurement void" in " ".join(gated.reasons)
    assert reported.verdict == "promote"
    assert any("client was starved" in c.message for c in reported.checks)


def test_no_kv_seen_because_the_metrics_missed_requests_says_so():
    partial = bench(kv=0)
    partial["server"].update(requests_seen=0, requests_ok=32)
    d = decide(COMPAT_OK, [partial], SLO_, None)
    assert failed(d) == {"kv_transfer"} and "metrics show 0 of 32 requests" in d.reasons[0]
    assert "of 32 requests" not in " ".join(decide(COMPAT_OK, [bench(kv=0)], SLO_, None).reasons)


def test_engines_replaced_during_validation_roll_back_even_when_everything_else_passes():
    replaced = ["prefill r1 replaced by r7"]
    d = decide(COMPAT_OK, [bench()], SLO_, None, replaced=replaced)
    assert d.verdict == "rollback" and failed(d) == {"engines_stable"} and "prefill r1 replaced by r7" in d.reasons[0]
    assert decide(COMPAT_OK, [bench()], SLO_, None, replaced=[]).verdict == "promote"
    assert "engines_stable" not in {c.check for c in decide(COMPAT_OK, [bench()], SLO_, None).checks}
