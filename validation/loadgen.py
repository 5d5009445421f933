"""Streaming load generator: a raw HTTP/1.1 asyncio Protocol on uvloop, every read timestamped in
data_received (the earliest point Python sees the bytes), SSE parsed after the run.

The hot path only frames: keep-alive connections opened before the clock starts, the request
encoded before its send stamp and written in one call, chunked bodies de-framed as they arrive.
(aiohttp spent ~0.5 ms per request before the bytes left, which queued a burst of 32 sends by
~15 ms; measured with scripts/bench_harness.py.)

Each request keeps raw (perf_counter, bytes) reads; `parse_record` turns them into timings:
scheduled send, actual send, first byte, first SSE event, first non-empty content (TTFT),
every content chunk, last chunk, server usage. Closed loop (fixed concurrency) or open loop
(constant / Poisson rate; latency also measured from the scheduled send). Warm-up requests are
excluded. The client watches its own event-loop lag and CPU and flags `client_bottleneck`.

`ramp_s` replaces the burst at the start of a run: closed loop, the concurrency slots start one by
one spread over ramp_s (slot j at j * ramp_s / concurrency); open loop, the arrival rate rises
linearly from 0 to `rate` over ramp_s (the schedule is the unramped one mapped through the inverse
of the ramped cumulative rate, so Poisson stays Poisson). Requests that start in the ramp are
measured like the rest (validation/interleave.py says why).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil  # a dependency of pdops (pyproject.toml), always installed

LAG_P99_LIMIT_MS = 10.0
CPU_LIMIT_PCT = 90.0
# An isolated client (run_workers(..., isolate=True)) asks for this nice value: above the local
# stack's engines (nice 10, workflows/targets/local_stack.py) and other work. Lowering nice below
# 0 needs CAP_SYS_NICE; without it the client keeps its nice and the report says which it had.
CLIENT_NICE = -5


@dataclass
class RawRecord:
    index: int
    warmup: bool
    scheduled: float | None
    sent: float = 0.0
    status: int | None = None
    reads: list[tuple[float, bytes]] = field(default_factory=list)
    done: float | None = None
    error: str | None = None
    expected_output_tokens: int | None = None
    expected_prompt_tokens: int | None = None


def parse_record(raw: RawRecord, t0: float = 0.0) -> dict:
    """Timings in seconds relative to t0 plus parsed content; pure function of the raw reads."""
    rec: dict[str, Any] = {
        "index": raw.index, "warmup": raw.warmup, "status": raw.status, "error": raw.error,
        "scheduled": None if raw.scheduled is None else raw.scheduled - t0,
        "sent": raw.sent - t0, "first_byte": None, "first_event": None, "first_content": None,
        "chunk_times": [], "chunk_chars": [], "last_chunk": None, "done": None if raw.done is None else raw.done - t0,
        "response_id": None, "usage": None, "finish_reason": None, "saw_done": False, "text": "",
        "expected_output_tokens": raw.expected_output_tokens,
        "expected_prompt_tokens": raw.expected_prompt_tokens,
    }
    if raw.reads:
        rec["first_byte"] = raw.reads[0][0] - t0
    text_parts: list[str] = []
    for t, payload in sse_payloads(raw.reads):
        if rec["first_event"] is None:
            rec["first_event"] = t - t0
        if payload.strip() == b"[DONE]":
            rec["saw_done"] = True
            continue
        try:
            d = json.loads(payload)
        except ValueError:
            rec["error"] = rec["error"] or "bad SSE json"
            continue
        if isinstance(d, dict):
            _add_chunk(rec, d, t - t0, text_parts)
    rec["text"] = "".join(text_parts)
    if rec["error"] is None and raw.status == 200 and rec["first_content"] is None:
        rec["error"] = "no content"
    return rec


def sse_payloads(reads: list[tuple[float, bytes]]) -> Iterator[tuple[float, bytes]]:
    """The data of each server-sent event in the body reads, with the time of the read that completed
    the event; events without data are left out."""
    buf = b""
    for t, data in reads:
        buf += data
        while True:
            # SSE events are separated by a blank line (\n\n or \r\n\r\n)
            i = buf.find(b"\n\n")
            j = buf.find(b"\r\n\r\n")
            if i < 0 and j < 0:
                break
            if j >= 0 and (i < 0 or j < i):
                ev, buf = buf[:j], buf[j + 4:]
            else:
                ev, buf = buf[:i], buf[i + 2:]
            payload = b"".join(line[5:].lstrip() for line in ev.splitlines() if line.startswith(b"data:"))
            if payload:
                yield t, payload


def _add_chunk(rec: dict[str, Any], d: dict, t: float, text_parts: list[str]) -> None:
    """One streamed JSON chunk, read at t (relative): its id, error, usage, finish reason and content."""
    if rec["response_id"] is None and d.get("id"):
        rec["response_id"] = d["id"]
    if "error" in d:
        rec["error"] = rec["error"] or f"stream error: {str(d['error'])[:200]}"
    if d.get("usage"):
        rec["usage"] = d["usage"]
    content = ""
    for c in d.get("choices") or []:
        delta = c.get("delta")
        if delta is not None:   # chat: the answer, and a reasoning model's reasoning
            content += (delta.get("content") or "") + (delta.get("reasoning_content") or "") + \
                (delta.get("reasoning") or "")
        else:                   # completions
            content += c.get("text") or ""
        if c.get("finish_reason"):
            rec["finish_reason"] = c["finish_reason"]
    rec["last_chunk"] = t
    if content:
        if rec["first_content"] is None:
            rec["first_content"] = t
        rec["chunk_times"].append(t)
        rec["chunk_chars"].append(len(content))
        text_parts.append(content)


class HealthSampler:
    """Samples event-loop lag (every interval) and process CPU% during the run."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.lags_ms: list[float] = []
        self.cpu: list[float] = []
        self._task: asyncio.Task | None = None
        self._proc = psutil.Process()

    async def _run(self) -> None:
        if self._proc:
            self._proc.cpu_percent(None)
            psutil.cpu_percent(None)   # system-wide, read again at stop: the machine's share in between
        last_cpu = time.perf_counter()
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t - self.interval) * 1000))
            if self._proc and time.perf_counter() - last_cpu > 0.5:
                self.cpu.append(self._proc.cpu_percent(None))
                last_cpu = time.perf_counter()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._proc:
            self.cpu.append(self._proc.cpu_percent(None))
        return summarize_health(self.lags_ms, self.cpu, machine_context())


def machine_context() -> dict:
    """What else the machine was doing: a starved client is often the machine's fault, not its own."""
    return {"cores": os.cpu_count() or 1, "load_avg_1m": round(os.getloadavg()[0], 2),
            "system_cpu_percent": psutil.cpu_percent(None),
            "client_nice": os.getpriority(os.PRIO_PROCESS, 0)}


def summarize_health(lags_ms: list[float], cpu: list[float], machine: dict | None = None) -> dict:
    lags = sorted(lags_ms)

    # No sample is null (docs/reports.md), not a healthy-looking 0
    def q(p: float) -> float | None:
        if not lags:
            return None
        return lags[min(len(lags) - 1, int(round(p / 100 * (len(lags) - 1))))]

    lag_p99 = q(99)
    cpu_max = max(cpu) if cpu else None
    cpu_mean = sum(cpu) / len(cpu) if cpu else None
    reasons = []
    if lag_p99 is not None and lag_p99 > LAG_P99_LIMIT_MS:
        reasons.append(f"event-loop lag p99 {lag_p99:.1f} ms > {LAG_P99_LIMIT_MS} ms")
    if cpu_mean is not None and cpu_mean > CPU_LIMIT_PCT:
        reasons.append(f"client CPU mean {cpu_mean:.0f}% > {CPU_LIMIT_PCT}%")
    if reasons and machine and machine["load_avg_1m"] > machine["cores"]:
        # The lag is time spent waiting for a CPU, not work of the client (its CPU mean says so).
        reasons.append(f"the machine was oversubscribed (load {machine['load_avg_1m']:.1f} on {machine['cores']} "
                       f"cores, client nice {machine['client_nice']}): the client waited for a CPU, so its "
                       "latencies include that wait and cannot be trusted; the server's own histograms "
                       "(vllm:* in the report) are not affected")
    return {"loop_lag_ms": {"p50": q(50), "p99": lag_p99, "max": lags[-1] if lags else None,
                            "samples": len(lags)},
            "cpu_percent": {"mean": cpu_mean, "max": cpu_max, "samples": len(cpu)},
            "client_bottleneck": bool(reasons), "reasons": reasons, "machine": machine}


@dataclass
class LoadSpec:
    base_url: str
    model: str
    make_request: Callable[[int], dict]   # index -> {"prompt"/"messages", "max_tokens", ...}
    endpoint: str = "chat"                # "chat" | "completions"
    concurrency: int | None = 1
    rate: float | None = None
    poisson: bool = False
    requests: int | None = 16
    duration: float | None = None
    warmup: int = 0
    api_key: str | None = None
    timeout: float = 600.0
    seed: int = 0
    progress: bool = False
    # A trace's arrival times (s from the start; validation/traces.py): open loop, one request each.
    arrivals: list[float] | None = None
    # the load rises over this many seconds instead of starting as a burst (module docstring)
    ramp_s: float = 0.0
    # closed loop: where this process's slots sit between the global slots (run_workers' worker w of n: w / n)
    ramp_phase: float = 0.0
    # Interim looks (slo.statistics.stop_early; validation/interim.py): when this many requests have
    # completed, `look` gets the parsed records completed so far, the seconds since the clock started
    # and how many requests were in flight; a non-None answer stops the run: no request is sent after
    # it, those in flight finish.
    # Not with a trace (its arrivals are the point) or with several workers (each would see its share).
    look_at: list[int] | None = None
    look: Callable[[list[dict], float, int], Any] | None = None


def ramped(u: float, ramp_s: float) -> float:
    """The time an arrival scheduled at `u` s (at the full rate from 0) is sent when the rate rises
    linearly from 0 to full over ramp_s: the inverse of the ramped cumulative rate
    (rate * t^2 / (2 ramp_s) before ramp_s, rate * (t - ramp_s / 2) after), so the k-th arrival of
    either schedule has seen the same expected number of arrivals before it."""
    if ramp_s <= 0:
        return u
    return (2 * ramp_s * u) ** 0.5 if u < ramp_s / 2 else u + ramp_s / 2


def slot_start(j: int, concurrency: int, ramp_s: float, phase: float = 0.0) -> float:
    """When closed-loop slot j of `concurrency` sends its first request: spread evenly over ramp_s."""
    return (j + phase) * ramp_s / max(1, concurrency) if ramp_s > 0 else 0.0


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time. Appends (perf_counter, body bytes)
    to the current RawRecord on every read; knows only enough HTTP to find the response's end."""

    # Set by connection_made, which asyncio calls before create_connection returns the protocol;
    # the waiter by send, before any read can finish a response.
    transport: asyncio.Transport
    waiter: asyncio.Future

    def __init__(self):
        self.raw: RawRecord | None = None
        self.reusable = True

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, payload: bytes, raw: RawRecord) -> asyncio.Future:
        self.raw, self.head, self.buf = raw, b"", b""
        self.length: int | None = None   # Content-Length left, or None
        self.chunk: int | None = None    # chunked: data bytes left (0: its CRLF next; None: size line next)
        self.chunked = False
        self.trailer: bool | None = False   # None: the last chunk and its trailers have ended
        self.waiter = asyncio.get_running_loop().create_future()
        raw.sent = time.perf_counter()
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        raw = self.raw
        if raw is None:
            return
        if raw.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.head[:end].decode("latin-1").split("\r\n")
            raw.status = int(lines[0].split(" ")[1])
            hdr = {k.strip().lower(): v.strip().lower() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            self.chunked = "chunked" in hdr.get("transfer-encoding", "")
            if not self.chunked and "content-length" in hdr:
                self.length = int(hdr["content-length"])
            self.reusable = hdr.get("connection") != "close" and (self.chunked or self.length is not None)
            data = self.head[end + 4:]
        if self.chunked:
            data = self._dechunk(data)
        elif self.length is not None:
            data = data[:self.length]
            self.length -= len(data)
        if data:
            raw.reads.append((t, data))
        if self.trailer is None or self.length == 0:
            self._finish(None)

    def _dechunk(self, data: bytes) -> bytes:
        """Body bytes of the chunks in `data`; sets trailer = None once the last chunk has ended."""
        buf, pos, out = self.buf + data, 0, []
        while self.trailer is not None:
            if self.chunk:                                   # inside a chunk's data
                piece = buf[pos:pos + self.chunk]
                out.append(piece)
                pos += len(piece)
                self.chunk -= len(piece)
                if self.chunk:
                    break
                continue                                     # chunk == 0: its CRLF next
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            line, pos = buf[pos:nl], nl + 2
            if self.chunk == 0:                              # the CRLF after a chunk's data
                self.chunk = None
            elif self.trailer:                               # trailers until an empty line
                if not line:
                    self.trailer = None
            else:
                size = int(line.split(b";")[0], 16)
                self.chunk, self.trailer = size or None, size == 0
        self.buf = buf[pos:]
        return b"".join(out)

    def _finish(self, error: str | None) -> None:
        raw, self.raw = self.raw, None
        if raw is None:
            return
        raw.done = time.perf_counter()
        if error:
            raw.error = error
            self.reusable = False
        elif raw.status != 200:
            raw.error = f"HTTP {raw.status}: " + b"".join(d for _, d in raw.reads)[:300].decode("utf-8", "replace")
        if not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc) -> None:
        self.reusable = False
        # a response without length or chunking ends when the server closes
        ends_at_close = (self.raw is not None and self.raw.status is not None and not self.chunked
                         and self.length is None)
        self._finish(None if ends_at_close else f"connection closed: {exc or 'by server'}")


class _Pool:
    """Idle keep-alive connections to one endpoint."""

    def __init__(self, url: str):
        u = urlsplit(url)
        if not u.hostname:
            raise ValueError(f"{url}: no host to send requests to")
        self.host, self.path = u.hostname, u.path or "/"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.idle: list[_Conn] = []

    async def fill(self, n: int) -> None:
        conns = await asyncio.gather(*(self._connect() for _ in range(n - len(self.idle))), return_exceptions=True)
        self.idle += [c for c in conns if isinstance(c, _Conn)]

    async def _connect(self) -> _Conn:
        _, conn = await asyncio.get_running_loop().create_connection(_Conn, self.host, self.port, ssl=self.ssl)
        return conn

    async def acquire(self) -> _Conn:
        while self.idle:
            c = self.idle.pop()
            if c.reusable and not c.transport.is_closing():
                return c
        return await self._connect()

    def release(self, c: _Conn) -> None:
        if c.reusable:
            self.idle.append(c)
        else:
            c.transport.close()

    def close(self) -> None:
        for c in self.idle:
            c.transport.close()


async def _one(pool: _Pool, head: bytes, payload: bytes, raw: RawRecord, timeout: float) -> None:
    try:
        conn = await pool.acquire()
    except OSError as e:
        raw.sent = raw.done = time.perf_counter()
        raw.error = f"{type(e).__name__}: {e}"
        return
    try:
        await asyncio.wait_for(conn.send(head % len(payload) + payload, raw), timeout)
    except TimeoutError:
        conn._finish(f"timeout after {timeout} s")
    pool.release(conn)


def _body(spec: LoadSpec, req: dict) -> dict:
    body = {"model": spec.model, "stream": True, "stream_options": {"include_usage": True}}
    body.update({k: v for k, v in req.items() if not k.startswith("_")})
    return body


class _LoadRun:
    """The requests of one run: their prompts and JSON, which comes next, and the three ways of sending
    them (a trace's arrivals, an open loop at a rate, a closed loop at a concurrency)."""

    def __init__(self, spec: LoadSpec, pool: _Pool):
        self.spec, self.pool = spec, pool
        self.head = (f"POST {pool.path} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\n"
                     "Content-Type: application/json\r\n"
                     + (f"Authorization: Bearer {spec.api_key}\r\n" if spec.api_key else "")
                     + "Content-Length: %d\r\n\r\n").encode()
        self.raws: list[RawRecord] = []
        self.rng = random.Random(spec.seed)
        # prompts (tokenized ones too) and JSON made before the clock when the count is known
        self.built = {i: self.build(i) for i in range(spec.requests or 0)}
        self.t_start = 0.0
        self.deadline: float | None = None
        self.counter = 0
        self.finished: list[dict] = []                # completed requests, parsed, in completion order (looks only)
        self.looks = sorted(spec.look_at or []) if spec.look is not None else []
        self.stopped: Any = None                       # the look's answer that stopped the run
        self.looking: list[asyncio.Future] = []        # the looks started (each in a thread)

    def build(self, i: int) -> tuple[dict, bytes]:
        req = self.spec.make_request(i)
        return req, json.dumps(_body(self.spec, req)).encode()

    async def warm_up(self) -> None:
        """Warm-up requests: sequential, before the clock, excluded from results."""
        for k in range(self.spec.warmup):
            r = RawRecord(index=-1 - k, warmup=True, scheduled=None)
            await _one(self.pool, self.head, self.build(-1 - k)[1], r, self.spec.timeout)

    def start_clock(self) -> None:
        self.t_start = time.perf_counter()
        self.deadline = None if self.spec.duration is None else self.t_start + self.spec.duration

    def next_index(self) -> int | None:
        """The next request's index; None once the count is reached, the duration is over or a look
        stopped the run."""
        if self.stopped is not None:
            return None
        if self.spec.requests is not None and self.counter >= self.spec.requests:
            return None
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return None
        self.counter += 1
        return self.counter - 1

    def new_raw(self, i: int, scheduled: float | None) -> tuple[RawRecord, bytes]:
        req, payload = self.built.pop(i) if i in self.built else self.build(i)
        r = RawRecord(index=i, warmup=False, scheduled=scheduled,
                      expected_output_tokens=req.get("max_tokens"),
                      expected_prompt_tokens=req.get("_prompt_tokens"))
        self.raws.append(r)
        return r, payload

    def send(self, r: RawRecord, payload: bytes) -> asyncio.Future:
        return asyncio.ensure_future(self.one(r, payload))

    async def one(self, r: RawRecord, payload: bytes) -> None:
        """One request; then, when the completed count reaches the next interim look, the look."""
        await _one(self.pool, self.head, payload, r, self.spec.timeout)
        if not self.looks or self.stopped is not None:
            return
        # parsed as each request ends, so a look stalls the event loop (and the reads of the requests in
        # flight) for its statistics only, not for parsing every record so far
        self.finished.append(parse_record(r, self.t_start))
        if len(self.finished) >= self.looks[0]:
            self.looks.pop(0)
            self.looking.append(asyncio.ensure_future(self._look(list(self.finished))))

    async def _look(self, records: list[dict]) -> None:
        """An interim look in a thread: the event loop goes on reading the requests in flight (the interpreter
        switches threads every few ms) instead of stalling for the look's statistics, and the slots go on
        sending until it says stop."""
        assert self.spec.look is not None
        in_flight = len(self.raws) - len(records)
        got = await asyncio.get_running_loop().run_in_executor(
            None, self.spec.look, records, time.perf_counter() - self.t_start, in_flight)
        self.stopped = self.stopped if self.stopped is not None else got

    async def replay(self, arrivals: list[float]) -> None:
        """A trace: one request at each arrival time, whatever is still running."""
        tasks = []
        for k, at in enumerate(arrivals):
            delay = self.t_start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(self.send(*self.new_raw(k, self.t_start + at)))
        if tasks:
            await asyncio.gather(*tasks)

    async def open_loop(self, rate: float) -> None:
        """Requests at `rate` per second (Poisson or evenly spaced, ramped), whatever is still running."""
        tasks = []
        t_next = self.t_start
        while True:
            i = self.next_index()
            if i is None:
                break
            at = self.t_start + ramped(t_next - self.t_start, self.spec.ramp_s)
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if (self.deadline is not None and time.perf_counter() >= self.deadline) or self.stopped is not None:
                break
            tasks.append(self.send(*self.new_raw(i, at)))
            t_next += self.rng.expovariate(rate) if self.spec.poisson else 1.0 / rate
        if tasks:
            await asyncio.gather(*tasks)

    async def closed_loop(self) -> None:
        """`concurrency` slots, each sending its next request when its last one has ended."""
        spec = self.spec

        async def slot(j: int) -> None:
            start = self.t_start + slot_start(j, spec.concurrency or 1, spec.ramp_s, spec.ramp_phase)
            if start > time.perf_counter():
                await asyncio.sleep(start - time.perf_counter())
            while True:
                i = self.next_index()
                if i is None:
                    return
                r, payload = self.new_raw(i, None)
                await self.one(r, payload)
                if spec.progress and len(self.raws) % 50 == 0:
                    print(f"[bench] {len(self.raws)} requests issued", file=sys.stderr)
        await asyncio.gather(*(slot(j) for j in range(spec.concurrency or 1)))


async def run_load(spec: LoadSpec) -> dict:
    """Run the load; returns {"records": [...parsed...], "client_health": {...}, "wall_s", ...}."""
    pool = _Pool(spec.base_url.rstrip("/") + ("/chat/completions" if spec.endpoint == "chat" else "/completions"))
    run = _LoadRun(spec, pool)
    try:
        await run.warm_up()
        if spec.concurrency:
            await pool.fill(spec.concurrency)
        health = HealthSampler()
        health.start()
        run.start_clock()
        if spec.arrivals is not None:
            await run.replay(spec.arrivals)
        elif spec.rate:
            await run.open_loop(spec.rate)
        else:
            await run.closed_loop()
        t_end = time.perf_counter()
        await asyncio.gather(*run.looking)   # a look still running when the load ended: its answer is kept
        client_health = await health.stop()
    finally:
        pool.close()
    records = [parse_record(r, run.t_start) for r in run.raws]
    return {"records": records, "client_health": client_health, "wall_s": t_end - run.t_start, "t0": run.t_start,
            "mode": "open" if spec.rate or spec.arrivals is not None else "closed", "stopped": run.stopped}


def run(spec: LoadSpec) -> dict:
    try:
        import uvloop
        return uvloop.run(run_load(spec))
    except ImportError:  # pragma: no cover
        return asyncio.run(run_load(spec))


_TIME_FIELDS = ("scheduled", "sent", "first_byte", "first_event", "first_content", "last_chunk", "done")


def _shift(rec: dict, dt: float) -> dict:
    for k in _TIME_FIELDS:
        if rec.get(k) is not None:
            rec[k] += dt
    rec["chunk_times"] = [t + dt for t in rec["chunk_times"]]
    return rec


def _raise_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, CLIENT_NICE)
    except OSError:   # EACCES/EPERM without CAP_SYS_NICE: keep the nice we have
        pass


def _worker_main(spec: LoadSpec, w: int, n: int, q) -> None:  # pragma: no cover - child process
    import dataclasses
    _raise_priority()
    base_make = spec.make_request
    share = dataclasses.replace(
        spec,
        make_request=lambda i: base_make(i * n + w if i >= 0 else i),
        concurrency=None if spec.concurrency is None else max(1, spec.concurrency // n + (w < spec.concurrency % n)),
        rate=None if spec.rate is None else spec.rate / n,
        requests=None if spec.requests is None else spec.requests // n + (w < spec.requests % n),
        warmup=spec.warmup if w == 0 else min(spec.warmup, 1),
        seed=spec.seed * 1000 + w, progress=False, ramp_phase=w / n)
    try:
        res: dict[str, Any] = run(share) if share.requests != 0 else {
            "records": [], "client_health": summarize_health([], []), "wall_s": 0.0, "t0": time.perf_counter(),
            "mode": "closed"}
        for r in res["records"]:
            r["index"] = r["index"] * n + w
            r["worker"] = w
        q.put((w, res, None))
    except BaseException as e:  # noqa: BLE001
        q.put((w, None, repr(e)))


def run_workers(spec: LoadSpec, workers: int, isolate: bool = False) -> dict:
    """Split the load over `workers` processes (fork), then merge onto one time axis. Each worker
    takes 1/N of the concurrency (or rate) and of the request count. `isolate`: even one worker
    runs in a process of its own, at CLIENT_NICE where permitted, so the caller's other work
    (a release that imported Ray and vLLM) does not share its CPU time or interpreter."""
    if workers <= 1 and not isolate:
        return run(spec)
    workers = max(1, workers)
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(spec, w, workers, q), daemon=True) for w in range(workers)]
    for p in procs:
        p.start()
    results, errors = {}, []
    for _ in procs:
        w, res, err = q.get(timeout=spec.timeout + (spec.duration or 0) + 600)
        if err:
            errors.append(f"worker {w}: {err}")
        else:
            results[w] = res
    for p in procs:
        p.join(10)
    if not results:
        raise RuntimeError("; ".join(errors))
    t0 = min(r["t0"] for r in results.values())
    t_end = max(r["t0"] + r["wall_s"] for r in results.values())
    records = []
    for res in results.values():
        records += [_shift(r, res["t0"] - t0) for r in res["records"]]
    records.sort(key=lambda r: r["sent"])
    healths = [r["client_health"] for r in results.values()]
    reasons = [f"worker {w}: {x}" for w, r in results.items() for x in r["client_health"]["reasons"]] + errors
    def worst(block: str, key: str) -> float | None:
        vals = [h[block][key] for h in healths if h[block][key] is not None]
        return max(vals) if vals else None

    health = {"loop_lag_ms": {"p50": worst("loop_lag_ms", "p50"), "p99": worst("loop_lag_ms", "p99"),
                              "max": worst("loop_lag_ms", "max"),
                              "samples": sum(h["loop_lag_ms"]["samples"] for h in healths)},
              "cpu_percent": {"mean": worst("cpu_percent", "mean"), "max": worst("cpu_percent", "max"),
                              "samples": sum(h["cpu_percent"]["samples"] for h in healths)},
              "client_bottleneck": bool(reasons), "reasons": reasons, "workers": workers,
              "machine": healths[0].get("machine"), "per_worker": healths}
    return {"records": records, "client_health": health, "wall_s": t_end - t0, "t0": t0,
            "mode": next(iter(results.values()))["mode"], "workers": workers,
            "stopped": next((r["stopped"] for r in results.values() if r.get("stopped") is not None), None)}
