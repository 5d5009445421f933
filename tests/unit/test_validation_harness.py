"""The latency harness against a server whose timings are known."""
from __future__ import annotations

import itertools

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import metrics
from validation.loadgen import LoadSpec, RawRecord, parse_record, run

TOL_MS = 15.0


def med(v):
    v = sorted(v)
    return v[len(v) // 2]


def _req(n_out=10):
    return lambda i: {"messages": [{"role": "user", "content": f"hello number {i}"}], "max_tokens": n_out}


@pytest.fixture(scope="module")
def server():
    with KnownTimingServer(first_token_delay=0.1, inter_token_delay=0.02, tokens=10) as s:
        yield s


def _truth_errors(server, res):
    """Per request: client timestamp minus the server's own write timestamp (same process, same
    perf_counter clock), so the harness's error is measured independently of scheduler jitter."""
    ttft_err, itl_client, itl_server = [], [], []
    t0 = res["t0"]
    for r in res["records"]:
        t = server.timings[r["response_id"]]
        ttft_err.append((r["first_content"] + t0 - t["content"][0]) * 1000)
        assert len(r["chunk_times"]) == len(t["content"])
        itl_client += [(b - a) * 1000 for a, b in zip(r["chunk_times"], r["chunk_times"][1:])]
        itl_server += [(b - a) * 1000 for a, b in zip(t["content"], t["content"][1:])]
    # medians: robust to a one-off stall of a loaded machine, still catch any systematic bias
    return ttft_err, itl_client, itl_server


@pytest.mark.parametrize("concurrency", [1, 4])
def test_ttft_and_itl_match_truth(server, concurrency):
    res = run(LoadSpec(server.base_url, "fake-model", _req(), concurrency=concurrency,
                       requests=4 * concurrency, warmup=1))
    m = metrics.compute(res["records"], res["wall_s"])
    assert m["requests_ok"] == 4 * concurrency and m["errors"] == 0
    ttft_err, itl_c, itl_s = _truth_errors(server, res)
    assert all(e >= 0 for e in ttft_err)          # a read can't precede the write
    assert med(ttft_err) < TOL_MS
    assert m["ttft_ms"]["p50"] >= 99.0  # server waits 100 ms after receipt
    assert abs(med(itl_c) - med(itl_s)) < 3.0
    assert m["itl_ms"]["p50"] >= 19.0 and m["tpot_ms"]["p50"] >= 19.0
    assert m["output_tokens"]["mean"] == 10
    assert not any(r["warmup"] for r in res["records"])


def test_early_role_chunk_does_not_shorten_ttft(server):
    assert server.early_role_chunk
    res = run(LoadSpec(server.base_url, "fake-model", _req(), concurrency=1, requests=3))
    lag = []
    for r in res["records"]:
        t = server.timings[r["response_id"]]
        assert t["role"] < t["content"][0] - 0.05         # the server did send the role chunk early
        assert r["first_event"] < r["first_content"]      # and the client saw it early ...
        assert (r["first_content"] - r["sent"]) * 1000 >= 99.0  # ... without ending TTFT there
        lag.append((r["first_content"] + res["t0"] - t["content"][0]) * 1000)
    assert med(lag) < TOL_MS


def test_multi_token_chunks_itl_per_chunk_tpot_per_token():
    with KnownTimingServer(first_token_delay=0.05, inter_token_delay=0.01, tokens=12, tokens_per_chunk=3) as s:
        res = run(LoadSpec(s.base_url, "fake-model", _req(12), concurrency=2, requests=4))
        _, itl_c, itl_s = _truth_errors(s, res)
    m = metrics.compute(res["records"], res["wall_s"])
    assert m["tokens_per_chunk"]["mean"] == pytest.approx(3.0)
    assert abs(med(itl_c) - med(itl_s)) < 3.0
    assert m["itl_ms"]["p50"] >= 29.0
    # 3 chunk gaps of ~30 ms spread over 11 token gaps: TPOT ~ 8.2 ms, well below ITL
    assert m["tpot_ms"]["mean"] < m["itl_ms"]["mean"] / 2


def test_open_loop_measures_from_schedule_and_counts_requests(server):
    res = run(LoadSpec(server.base_url, "fake-model", _req(), concurrency=None, rate=50.0, poisson=True,
                       requests=10))
    m = metrics.compute(res["records"], res["wall_s"], open_loop=True)
    assert m["requests_ok"] == 10
    assert all(r["scheduled"] is not None for r in res["records"])
    assert m["ttft_from_scheduled_ms"]["mean"] >= m["ttft_ms"]["mean"] - 0.5


def test_duration_bound(server):
    res = run(LoadSpec(server.base_url, "fake-model", _req(2), concurrency=2, requests=None, duration=0.5))
    assert 2 <= len(res["records"]) <= 20
    assert res["wall_s"] < 2.0


def test_errors_recorded_not_raised(server):
    res = run(LoadSpec(server.base_url, "no-such-model", _req(), concurrency=1, requests=2))
    m = metrics.compute(res["records"], res["wall_s"])
    assert m["errors"] == 2 and m["error_rate"] == 1.0
    assert "404" in m["error_samples"][0]


def test_long_response_over_64k_chunk():
    # one 200 KB content chunk must not break the reader (aiohttp default buffer is 64 KB)
    big = "x" * 200_000
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.0, tokens=3) as s:
        s._gen_tokens = lambda seed, idx, n: [big] * n
        res = run(LoadSpec(s.base_url, "fake-model", _req(3), concurrency=1, requests=1))
    r = res["records"][0]
    assert r["error"] is None and len(r["text"]) == 600_000 and r["saw_done"]


def test_parse_record_splits_events_across_reads():
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}\n\n'
    raw = RawRecord(index=0, warmup=False, scheduled=None, sent=1.0, status=200)
    raw.reads = [(1.1, b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'),
                 (1.2, chunk[:10]), (1.3, chunk[10:] + chunk), (1.4, b'data: {"choices":[],"usage":'
                                                                   b'{"completion_tokens":4}}\r\n\r\ndata: [DONE]\n\n')]
    raw.done = 1.5
    r = parse_record(raw)
    assert r["first_byte"] == 1.1 and r["first_event"] == 1.1
    assert r["first_content"] == 1.3  # completed at the read that finished the event
    assert r["chunk_times"] == [1.3, 1.3] and r["text"] == "abab"
    assert r["usage"] == {"completion_tokens": 4} and r["saw_done"]


def test_client_health_flags_bottleneck():
    from validation.loadgen import summarize_health
    assert not summarize_health([0.1] * 100, [10.0])["client_bottleneck"]
    h = summarize_health([0.1] * 90 + [50.0] * 10, [10.0])
    assert h["client_bottleneck"] and "lag" in h["reasons"][0]
    assert summarize_health([0.1], [95.0, 99.0])["client_bottleneck"]


def test_workers_split_and_merge(server):
    from validation.loadgen import run_workers
    res = run_workers(LoadSpec(server.base_url, "fake-model", _req(), concurrency=4, requests=9), 2)
    m = metrics.compute(res["records"], res["wall_s"])
    assert m["requests_ok"] == 9 and sorted(r["index"] for r in res["records"]) == list(range(9))
    assert {r["worker"] for r in res["records"]} == {0, 1}
    assert res["client_health"]["workers"] == 2
    ttft_err, _, _ = _truth_errors(server, res)
    assert all(e >= 0 for e in ttft_err) and med(ttft_err) < TOL_MS
    assert res["wall_s"] < 5.0


def test_raw_client_deframes_responses_split_anywhere():
    import asyncio
    from types import SimpleNamespace

    from validation.loadgen import _Conn
    events = [b'data: {"a": 1}\n\n', b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")
    sized = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!"

    async def feed(resp, step):
        conn = _Conn()
        conn.transport = SimpleNamespace(write=lambda b: None)
        raw = RawRecord(index=0, warmup=False, scheduled=None)
        done = conn.send(b"", raw)
        for i in range(0, len(resp), step):
            assert not done.done()          # the response is not over before its last byte
            conn.data_received(resp[i:i + step])
        assert done.done()
        return conn, raw

    for step in (1, 2, 7, 64, len(chunked)):
        conn, raw = asyncio.run(feed(chunked, step))
        assert raw.status == 200 and raw.error is None and conn.reusable
        assert b"".join(d for _, d in raw.reads) == b"".join(events)
        _, raw = asyncio.run(feed(sized, step))
        assert raw.error == "HTTP 404: nope!"


def test_raw_client_against_uvicorn():
    """The HTTP stack vLLM and Ray Serve answer with (h11 via uvicorn), not only our own fake."""
    import asyncio
    import threading
    import time
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        if body["model"] != "m":
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)

        async def gen():
            yield b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
            for i in range(5):
                await asyncio.sleep(0.01)
                yield b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i
            yield b'data: {"id":"x","choices":[],"usage":{"completion_tokens":5}}\n\ndata: [DONE]\n\n'
        return StreamingResponse(gen(), media_type="text/event-stream")

    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
                                           host="127.0.0.1", port=0, log_level="error", lifespan="off"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        res = run(LoadSpec(f"http://127.0.0.1:{port}/v1", "m", _req(5), concurrency=2, requests=4))
        bad = run(LoadSpec(f"http://127.0.0.1:{port}/v1", "nope", _req(5), concurrency=1, requests=1))
    finally:
        server.should_exit = True
        t.join(5)
    for r in res["records"]:
        assert r["error"] is None and r["text"] == "t0t1t2t3t4" and r["saw_done"] and r["usage"]
        assert len(r["chunk_times"]) == 5 and r["first_content"] - r["sent"] >= 0.009
    assert bad["records"][0]["error"].startswith("HTTP 404")


def test_ramp_starts_the_closed_loop_slots_one_by_one_instead_of_a_burst(server):
    """ramp_s (validation/loadgen.py): slot j of a closed loop sends its first request at
    j * ramp_s / concurrency; without a ramp every slot sends at once. Requests started in the ramp
    are measured (validation/interleave.py says why)."""
    spec = LoadSpec(server.base_url, "fake-model", _req(2), concurrency=4, requests=8)
    burst = sorted(r["sent"] for r in run(spec)["records"])[:4]
    # each request takes 0.28 s here, longer than the ramp: the first four sends are the four slots'
    ramped = run(LoadSpec(server.base_url, "fake-model", _req(10), concurrency=4, requests=8, ramp_s=0.2))
    firsts = sorted(r["sent"] for r in ramped["records"])[:4]
    assert burst[-1] - burst[0] < 0.03
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert all(0.035 < g < 0.08 for g in gaps), gaps          # 0.05 s apart: 0.2 s over 4 slots
    assert metrics.compute(ramped["records"], ramped["wall_s"])["requests_ok"] == 8   # none dropped


def test_open_loop_ramp_raises_the_rate_linearly():
    """The ramped schedule is the unramped one through the inverse of the ramped cumulative rate:
    continuous at ramp_s/2, and after the ramp the same spacing shifted by ramp_s/2."""
    from validation.loadgen import ramped as at

    assert at(1.0, 0.0) == 1.0
    assert at(0.5, 1.0) == pytest.approx(1.0) and at(0.5 - 1e-9, 1.0) == pytest.approx(1.0)
    assert at(3.0, 1.0) - at(2.0, 1.0) == pytest.approx(1.0)           # full rate after the ramp
    # arrivals at 10/s: fewer in the ramp's first half than in its second, the full 10/s after
    sends = [at(k / 10, 2.0) for k in range(60)]
    first, second = sum(t < 1.0 for t in sends), sum(1.0 <= t < 2.0 for t in sends)
    assert first == 3 and second == 7 and sum(2.0 <= t < 3.0 for t in sends) == 10


def test_open_loop_ramp_through_the_harness(server):
    res = run(LoadSpec(server.base_url, "fake-model", _req(2), concurrency=None, rate=20.0, requests=20, ramp_s=1.0))
    sched = sorted(r["scheduled"] for r in res["records"])
    assert sched[1] - sched[0] > 0.15    # the second arrival waits sqrt(2 * 1.0 * 0.05) = 0.32 s
    assert sched[-1] - sched[-2] == pytest.approx(0.05, abs=1e-6)   # then 20/s
