"""TPOT only where the client timed decode (validation/metrics.py decode_timing), and the gate failing
TPOT inconclusive on a side that timed too few requests (validation/judge.py tpot_coverage), so
slo.statistics.inconclusive decides (fail by default: closed).

The defect these pin (docs/measurements.md, real local A/A second batch, 2026-12-05): a 128-token stream
that reached the client in one read after a client stall gave a TPOT of 0.03 ms, which moved its block
pair's ratio about 80x and rolled back an identical release. Nothing here is emulated except the server
of the last test (tests/fakes/known_timing_server.py: a real HTTP server with known timings, on 127.0.0.1).
"""
from __future__ import annotations

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from tests.unit.test_gate_failclosed import COMPAT, bench, slo
from validation import judge, metrics, profiles
from validation.bench import BenchConfig, run_bench
from validation.gate import decide
from validation.reports.bench import BenchReport
from validation.sequential import merge_bench


def rec(first: float, chunks: list[float], tokens: int | None, last: float | None = None) -> dict:
    return {"warmup": False, "status": 200, "error": None, "sent": 0.0, "scheduled": None, "first_content": first,
            "chunk_times": chunks, "last_chunk": last if last is not None else chunks[-1], "done": None,
            "usage": {"completion_tokens": tokens} if tokens is not None else None}


def test_a_stream_received_in_one_read_has_no_tpot_not_a_tiny_one():
    # the A/A artefact: 128 content events all read at 0.5 s (a stall), the usage chunk 4 ms later
    r = rec(0.5, [0.5] * 128, 128, last=0.504)
    p = metrics.per_request(r)
    assert p["tpot"] is None and p["tpot_unmeasured"] == "one_read"
    # the rule before: (e2e - ttft) / 127 = 0.031 ms, a figure the gate then judged
    assert (504 - 500) / 127 == pytest.approx(0.0315, abs=1e-4)


def test_a_stream_whose_later_half_came_in_one_read_is_not_timed():
    # first 20 events spread 10 ms apart, then a stall: the other 107 in one read at 1.5 s
    chunks = [0.1 + 0.01 * i for i in range(20)] + [1.5] * 108
    assert metrics.decode_timing(rec(0.1, chunks, 128), 128) is None          # 127 later events, all in later reads
    # only 10 of 127 later events after the first read: decode not seen
    chunks = [0.1] * 118 + [0.1 + 0.01 * i for i in range(1, 11)]
    assert metrics.decode_timing(rec(0.1, chunks, 128), 128) == "decode_not_timed"
    # exactly half in later reads is timed (a batched stream: several events per read is healthy)
    chunks = [0.1] * 5 + [0.2] * 4
    assert metrics.decode_timing(rec(0.1, chunks, 9), 9) is None
    chunks = [0.1] * 6 + [0.2] * 3
    assert metrics.decode_timing(rec(0.1, chunks, 9), 9) == "decode_not_timed"


def test_each_reason_is_counted_and_a_timed_request_keeps_its_tpot():
    recs = [rec(0.1, [0.1, 0.12, 0.14, 0.16, 0.18], 5),      # timed: (180 - 100) / 4 = 20 ms
            rec(0.1, [0.1], 1),                               # one_token
            rec(0.1, [0.1, 0.2], None),                       # no_usage
            rec(0.1, [0.1, 0.1, 0.1], 3, last=0.101),         # one_read
            rec(0.1, [0.1] * 4 + [0.3], 5)]                   # decode_not_timed (1 of 4 later events)
    m = metrics.compute(recs, wall_s=1.0)
    assert m["tpot_ms"]["count"] == 1 and m["tpot_ms"]["mean"] == pytest.approx(20.0)
    assert m["tpot_unmeasured"] == {"decode_not_timed": 1, "no_usage": 1, "one_read": 1, "one_token": 1}
    assert metrics.samples(recs)["tpot"] == [20.0]


def _with_tpot(b: dict, timed: int, unmeasured: dict[str, int]) -> BenchReport:
    b = {**b, "tpot_unmeasured": unmeasured, "samples": {**b["samples"], "tpot": b["samples"]["tpot"][:timed]}}
    b["tpot_ms"] = metrics.summary(b["samples"]["tpot"])
    b["samples"]["tpot_block"] = b["samples"]["block"][:timed]
    return BenchReport.coerce(b)


def test_coverage_counts_multi_token_requests_only():
    b = bench(n=40, blocks=4)
    assert judge.tpot_coverage(_with_tpot(b, 10, {"one_read": 30})) is None          # 10 of 40: 1/4, judged
    why = judge.tpot_coverage(_with_tpot(b, 9, {"one_read": 31}))
    assert why is not None and "TPOT timed on 9 of 40" in why and "31 one_read" in why
    # one-token answers have no decode: 9 timed of 40 - 20 one-token = 20 multi-token requests
    assert judge.tpot_coverage(_with_tpot(b, 9, {"one_token": 20, "one_read": 11})) is None
    # a report from before the count: every successful request taken as multi-token (the strict reading)
    old = _with_tpot(b, 9, {})
    old.tpot_unmeasured = None
    assert judge.tpot_coverage(old) is not None


def test_the_gate_fails_tpot_closed_on_too_few_timed_requests_unless_point_estimate_is_chosen():
    cand = BenchReport.coerce(bench(n=40, blocks=4, seed=1))
    base_ok = _with_tpot(bench(n=40, blocks=4, seed=2), 40, {})
    base_bad = _with_tpot(bench(n=40, blocks=4, seed=2), 3, {"one_read": 37})
    s = slo()
    by = lambda d: {c.check: c for c in d.checks if c.check.startswith("vs_stable_tpot")}  # noqa: E731
    good = by(decide(COMPAT, [cand], s, [base_ok]))["vs_stable_tpot_p90"]
    bad = by(decide(COMPAT, [cand], s, [base_bad]))["vs_stable_tpot_p90"]
    assert good.interval is not None                  # judged: the paired-block interval
    # no interval, so inconclusive, and slo.statistics.inconclusive (fail by default) decides: not promoted
    assert not bad.ok and bad.interval is None and bad.verdict == "inconclusive"
    assert "baseline: TPOT timed on 3 of 40" in bad.message and "inconclusive: fail" in bad.message
    # an environment that chose point_estimate gets the timed requests' own ratio, and the message says so
    pe = s.model_copy(update={"statistics": s.statistics.model_copy(update={"inconclusive": "point_estimate"})})
    by_point = by(decide(COMPAT, [cand], pe, [base_bad]))["vs_stable_tpot_p90"]
    assert by_point.verdict == "inconclusive" and "decided by the point estimate" in by_point.message
    assert by_point.value == pytest.approx(cand.tpot_ms.p90 / base_bad.tpot_ms.p90)
    slower = BenchReport.coerce(bench(n=40, blocks=4, seed=1, scale=3.0))     # 3x slower: beyond 1.1x
    assert not by(decide(COMPAT, [slower], pe, [base_bad]))["vs_stable_tpot_p90"].ok
    # and the candidate's own absolute TPOT SLO, on the same defect
    d = decide(COMPAT, [_with_tpot(bench(n=40, blocks=4, seed=1), 3, {"one_read": 37})],
               s.model_copy(update={"decode": s.decode.model_copy(update={"tpot_p90_ms": 100})}))
    tpot = next(c for c in d.checks if c.check == "tpot_p90_ms")
    assert not tpot.ok and tpot.verdict == "inconclusive" and "no interval: TPOT timed on 3 of 40" in tpot.message
    assert d.verdict != "promote"


def test_merging_blocks_sums_the_reasons():
    a = _with_tpot(bench(n=40, blocks=4, seed=1), 30, {"one_read": 8, "one_token": 2})
    b = _with_tpot(bench(n=40, blocks=4, seed=2), 35, {"one_read": 5})
    assert merge_bench(a, b).tpot_unmeasured == {"one_read": 13, "one_token": 2}
    b.tpot_unmeasured = None
    assert merge_bench(a, b).tpot_unmeasured is None   # one side unknown: the sum is unknown


@pytest.mark.parametrize("inter_token_delay, timed", [(0.0, False), (0.01, True)])
def test_the_bench_against_a_real_stream(inter_token_delay, timed):
    """A real HTTP stream on 127.0.0.1: 8 tokens written at once reach the client in one read (no TPOT,
    reason one_read); written 10 ms apart, every request is timed near 10 ms a token."""
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=inter_token_delay, tokens=8) as srv:
        b = run_bench(BenchConfig(srv.base_url, srv.model, profiles.get("balanced"), concurrency=2, requests=12,
                                  seed=0))
    assert b.requests_ok == 12
    if timed:
        assert b.tpot_unmeasured == {} and len(b.samples.tpot) == 12
        assert 8.0 < b.tpot_ms.p50 < 30.0
    else:
        assert b.tpot_unmeasured == {"one_read": 12} and not b.samples.tpot
        assert judge.tpot_coverage(b) is not None
