"""Metric math on hand-made records."""
from __future__ import annotations

import math

import pytest

from validation import metrics


def rec(sent, first, chunks, tokens, scheduled=None, error=None, status=200, warmup=False):
    return {"index": 0, "warmup": warmup, "status": status, "error": error, "scheduled": scheduled,
            "sent": sent, "first_content": first, "chunk_times": chunks,
            "last_chunk": chunks[-1] if chunks else None, "done": chunks[-1] if chunks else None,
            "usage": {"completion_tokens": tokens} if tokens is not None else None}


def test_percentiles_linear():
    v = list(range(1, 101))
    assert metrics.percentile(v, 50) == pytest.approx(50.5)
    assert metrics.percentile(v, 99) == pytest.approx(99.01)
    s = metrics.summary([3.0, 1.0, 2.0])
    assert s["mean"] == 2.0 and s["p50"] == 2.0 and s["max"] == 3.0 and s["count"] == 3
    assert metrics.summary([])["mean"] is None


def test_ttft_itl_tpot_e2e():
    # TTFT 100 ms; chunks at 0.1, 0.12, 0.16 ; 5 tokens (a chunk may hold several)
    r = rec(0.0, 0.1, [0.1, 0.12, 0.16], 5)
    m = metrics.compute([r], wall_s=1.0)
    assert m["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert m["e2e_ms"]["mean"] == pytest.approx(160.0)
    assert m["itl_ms"]["count"] == 2
    assert m["itl_ms"]["mean"] == pytest.approx(30.0)
    assert m["tpot_ms"]["mean"] == pytest.approx(60.0 / 4)
    assert m["tokens_per_chunk"]["mean"] == pytest.approx(5 / 3)
    assert m["output_token_throughput_tps"] == pytest.approx(5.0)


def test_itl_pooled_over_chunks_not_averaged_per_request():
    a = rec(0.0, 0.1, [0.1, 0.11, 0.12, 0.13, 0.14], 5)  # 4 gaps of 10 ms
    b = rec(0.0, 0.1, [0.1, 0.2], 2)                      # 1 gap of 100 ms
    m = metrics.compute([a, b], wall_s=1.0)
    assert m["itl_ms"]["mean"] == pytest.approx((40 + 100) / 5)


def test_errors_warmup_and_goodput():
    good = rec(0.0, 0.05, [0.05, 0.06, 0.07], 3)           # ttft 50, tpot 10
    slow_ttft = rec(0.0, 0.5, [0.5, 0.51, 0.52], 3)        # ttft 500
    slow_tpot = rec(0.0, 0.05, [0.05, 0.25, 0.45], 3)      # tpot 200
    err = rec(0.0, None, [], None, error="HTTP 500", status=500)
    warm = rec(0.0, 9.0, [9.0, 9.5], 2, warmup=True)
    m = metrics.compute([good, slow_ttft, slow_tpot, err, warm], wall_s=2.0,
                        goodput_ttft_ms=100, goodput_tpot_ms=50)
    assert m["requests_total"] == 4 and m["requests_ok"] == 3 and m["errors"] == 1
    assert m["error_rate"] == pytest.approx(0.25)
    assert m["goodput_requests"] == 1
    assert m["goodput_rps"] == pytest.approx(0.5)
    assert m["slo_attainment"] == pytest.approx(0.25)
    assert m["request_throughput_rps"] == pytest.approx(1.5)
    assert m["ttft_ms"]["max"] == pytest.approx(500.0)  # warm-up's 9 s excluded


def test_open_loop_latency_from_scheduled_send():
    r = rec(1.0, 1.1, [1.1, 1.2], 2, scheduled=0.5)  # client sent 500 ms late
    m = metrics.compute([r], wall_s=1.0, goodput_ttft_ms=200, open_loop=True)
    assert m["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert m["ttft_from_scheduled_ms"]["mean"] == pytest.approx(600.0)
    assert m["goodput_requests"] == 0  # the SLO is judged from the scheduled time


def test_missing_usage_gives_no_tpot():
    r = rec(0.0, 0.1, [0.1, 0.2], None)
    m = metrics.compute([r], wall_s=1.0)
    assert m["tpot_ms"]["count"] == 0 and m["requests_missing_usage"] == 1
    assert not math.isnan(m["ttft_ms"]["mean"])
