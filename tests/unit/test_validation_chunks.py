"""A server that batches its stream (several tokens per SSE chunk, as Ray Serve does): client
chunk gaps are marked chunk-level and the gate judges ITL from the server histogram or TPOT."""
from __future__ import annotations

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles, report
from validation.bench import BenchConfig, run_bench
from validation.config import SLO, DecodeSLO
from validation.gate import decide

SLO_ITL = SLO(decode=DecodeSLO(itl_p90_ms=15), kv_transfer="ignored")


def _itl_check(bench):
    d = decide({"ok": True, "required_failures": []}, [bench], SLO_ITL)
    return d, next(c for c in d.checks if c.check == "itl_p90_ms")


@pytest.fixture(scope="module")
def batched():
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.005, tokens=16, tokens_per_chunk=4) as s:
        yield run_bench(BenchConfig(s.base_url, "fake-model", profiles.custom(8, 16), concurrency=2, requests=6,
                                    metrics_url=f"http://127.0.0.1:{s.port}/metrics"))


def test_chunk_level_itl_is_marked(batched):
    assert batched.tokens_per_chunk.mean == pytest.approx(4.0)
    assert batched.itl_level == "chunk"
    assert batched.itl_ms.p50 >= 19.0          # gaps between 4-token chunks, ~20 ms
    h = batched.server.histograms["inter_token_latency_seconds"]
    assert h.count == 6 * 3 * 4                   # per request: 3 later chunks of 4 tokens
    assert h.p50_ms <= 10.0                       # per token ~5 ms (bucket-interpolated)


def test_gate_uses_server_itl_histogram_then_tpot(batched):
    d, c = _itl_check(batched)
    assert c.ok and "vllm:inter_token_latency_seconds" in c.message and "4.0 tokens" in c.message
    no_server = batched.model_copy(update={"server": None})
    _, c = _itl_check(no_server)
    assert c.value == batched.tpot_ms.p90 and "TPOT" in c.message
    md = report.markdown(d, None, [batched])
    assert "(chunk)" in md and "the gate used server vllm:inter_token_latency_seconds" in md


def test_report_shows_client_and_server_side_by_side(batched):
    d, _ = _itl_check(batched)
    md = report.markdown(d, None, [batched])
    sec = md.split("## Client vs server (ms)")[1].split("## ")[0]
    rows = [ln for ln in sec.splitlines() if ln.startswith("| #0")]
    assert [r.split(" | ")[1] for r in rows] == ["ttft", "itl", "tpot"]
    assert "vllm:time_to_first_token_seconds" in rows[0]


def test_one_token_per_chunk_keeps_client_itl():
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.002, tokens=8) as s:
        b = run_bench(BenchConfig(s.base_url, "fake-model", profiles.custom(8, 8), concurrency=1, requests=2,
                                  metrics_url=f"http://127.0.0.1:{s.port}/metrics"))
    assert b.itl_level == "token"
    _, c = _itl_check(b)
    assert "from client ITL" in c.message and c.value == b.itl_ms.p90


def test_server_window_excludes_warmup():
    with KnownTimingServer(first_token_delay=0.005, inter_token_delay=0.001, tokens=4) as s:
        b = run_bench(BenchConfig(s.base_url, "fake-model", profiles.custom(8, 4), concurrency=2, requests=4, warmup=2,
                                  metrics_url=f"http://127.0.0.1:{s.port}/metrics"))
        assert len(s.timings) == 6
    assert b.requests_ok == 4 and b.server.histograms["time_to_first_token_seconds"].count == 4
