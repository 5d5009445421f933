"""An OpenAI-compatible server with known timings, for testing the latency harness and the
compatibility suite. Runs on 127.0.0.1 on an ephemeral port in a background thread (or, for the
benchmark script, in processes of its own: `python -m tests.fakes.known_timing_server`).

    with KnownTimingServer(first_token_delay=0.1, inter_token_delay=0.02, tokens=16) as srv:
        srv.base_url  # http://127.0.0.1:PORT/v1

It is a reference clock for the harness, so it must not be the bottleneck at 256 streams on two
cores. Three layers, one concern each:
- the OpenAI layer (`_dispatch`) validates a request and answers a `Reply` or a `Stream` whose SSE
  events are each due at a known offset from the request's receipt;
- the HTTP/1.1 layer (`_Conn`, a raw asyncio Protocol, uvloop when installed) frames and writes
  them; an event is encoded one step ahead, so its due time only costs a socket write;
- `DeadlineTimer` fires at absolute time.perf_counter() deadlines with microsecond precision and
  never early (event-loop timers round to milliseconds; uvloop's fire up to 1.2 ms early).
Every content write is stamped (`timings`, `/_timings`), and `/metrics` exports vLLM-named TTFT,
ITL and TPOT histograms of those stamps, so server-side figures are known too.

With `pd` (tests/fakes/pd_queues.PDQueues) each request passes a prefill and a decode stage of
known capacity, so one side queues as set, and /metrics adds per-engine series as Ray's engines
export them.

"Broken" switches make it misbehave in one specific way each, so tests can prove the compat
suite catches it.
"""
from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus

from tests.fakes.pd_queues import PDQueues

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Broken:
    missing_usage: bool = False        # no usage chunk even with include_usage; no usage non-stream
    missing_done: bool = False         # stream ends without data: [DONE]
    wrong_finish_reason: bool = False  # "stop" even when max_tokens hit
    error_500: bool = False            # 500 instead of 400 on bad input
    inconsistent_usage: bool = False   # total_tokens != prompt + completion


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    delay: float = 0.0                 # seconds after the request's receipt


@dataclass
class Stream:
    """SSE events in time order, each (seconds after receipt, encoded event, timing mark, tokens
    in it). An iterator: each event is encoded after the one before it is written, since encoding
    a whole stream on receipt (~250 us) queued the receipt of the next requests in a burst."""
    rid: str
    events: Iterator[tuple[float, bytes, str | None, int]]


def _json(status: int, obj) -> Reply:
    return Reply(status, json.dumps(obj).encode())


# ---- timer -------------------------------------------------------------------------------------
class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_CLOCK_MONOTONIC, _TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = 1, os.O_NONBLOCK, os.O_CLOEXEC, 1


class DeadlineTimer:
    """Callbacks at absolute perf_counter() deadlines: one Linux timerfd on CLOCK_MONOTONIC (the
    clock perf_counter reads) armed to the earliest deadline and watched by the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._heap: list = []
        self._seq = itertools.count()
        self._armed: float | None = None
        self._loop = loop
        loop.add_reader(self.fd, self._fire)

    def at(self, deadline: float, cb, *args) -> None:
        heapq.heappush(self._heap, (deadline, next(self._seq), cb, args))
        if self._armed is None or deadline < self._armed:
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        sec = int(deadline)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, max(1, int((deadline - sec) * 1e9))))
        if _libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self._armed = deadline

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        self._armed = None
        heap = self._heap
        while heap and heap[0][0] <= time.perf_counter():
            _, _, cb, args = heapq.heappop(heap)
            cb(*args)
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        self._loop.remove_reader(self.fd)
        os.close(self.fd)


# ---- HTTP/1.1 ----------------------------------------------------------------------------------
class _Conn(asyncio.Protocol):
    """One keep-alive connection: Content-Length request bodies (what aiohttp and httpx send),
    one request at a time (a pipelined one waits), chunked SSE responses."""

    def __init__(self, srv: KnownTimingServer):
        self.srv = srv
        self.buf = b""
        self.first_byte: float | None = None
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self.buf[:end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        size = int(headers.get("content-length") or 0)
        if len(self.buf) < end + 4 + size:
            return
        body, self.buf = self.buf[end + 4:end + 4 + size], self.buf[end + 4 + size:]
        received, self.first_byte = self.first_byte, (time.perf_counter() if self.buf else None)
        method, target = lines[0].split(" ")[:2]
        self.busy = True
        out = self.srv._dispatch(method, target.split("?")[0], headers, body, received)
        if isinstance(out, Stream):
            self._write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
            self.srv._stream(self, out, received)
        elif out.delay > 0:
            self.srv.timer.at(received + out.delay, self._reply, out)
        else:
            self._reply(out)

    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def _reply(self, r: Reply) -> None:
        self._write(f"HTTP/1.1 {r.status} {HTTPStatus(r.status).phrase}\r\nContent-Type: {r.content_type}\r\n"
                    f"Content-Length: {len(r.body)}\r\n\r\n".encode() + r.body)
        self.done()

    def done(self) -> None:
        self.busy = False
        self._next()


# ---- the server --------------------------------------------------------------------------------
@dataclass
class KnownTimingServer:
    first_token_delay: float = 0.1
    inter_token_delay: float = 0.02
    tokens: int = 16
    tokens_per_chunk: int = 1
    model: str = "fake-model"
    context_len: int = 4096
    early_role_chunk: bool = True
    api_key: str | None = None
    # Realistic jitter (0 = exact timings): each request's TTFT is first_token_delay x lognormal(0,
    # ttft_spread); its decode speed inter_token_delay x lognormal(0, itl_spread), and each gap again
    # x lognormal(0, gap_spread). (The gate's simulator, scripts/bench_gate_sim.py, draws its own world.)
    ttft_spread: float = 0.0
    itl_spread: float = 0.0
    gap_spread: float = 0.0
    jitter_seed: int = 0
    broken: Broken = field(default_factory=Broken)
    host: str = "127.0.0.1"
    # A local HF tokenizer directory: prompt tokens are then counted as vLLM counts them (chat
    # through the chat template with the generation prompt), not one per word.
    tokenizer: str | None = None
    # Prefill and decode stages of known capacity: requests queue on the side that is short.
    pd: PDQueues | None = None

    port: int = 0
    # per response id: perf_counter times of receipt, role chunk, every content chunk write, and
    # the tokens in each content chunk
    timings: dict = field(default_factory=dict)
    timer: DeadlineTimer | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _servers: list = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, sock: socket.socket | None = None) -> KnownTimingServer:
        """Serve in a background thread on a port of its own (`port`), and also on `sock` when
        given (a SO_REUSEPORT listener shared by several processes)."""
        ready = threading.Event()
        err: list[BaseException] = []

        def run() -> None:
            loop = _new_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start(sock))
            except BaseException as e:  # pragma: no cover
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            for srv in self._servers:
                srv.close()
            self.timer.close()
            loop.close()

        self._thread = threading.Thread(target=run, name="known-timing-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        return self

    async def _start(self, sock: socket.socket | None) -> None:
        loop = asyncio.get_running_loop()
        self.timer = DeadlineTimer(loop)
        self._servers = [await loop.create_server(lambda: _Conn(self), self.host, 0, backlog=4096)]
        if sock is not None:
            self._servers.append(await loop.create_server(lambda: _Conn(self), sock=sock, backlog=4096))
        self.port = self._servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> KnownTimingServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- streaming: write each pre-encoded event group at its deadline --------------------
    def _stream(self, conn: _Conn, s: Stream, received: float) -> None:
        tim = self.timings[s.rid] = {"received": received, "role": None, "content": [], "tokens": []}
        self._schedule(conn, tim, s.events, next(s.events), received)

    def _schedule(self, conn: _Conn, tim: dict, events: Iterator, first: tuple, received: float) -> None:
        """Encode the events due with `first` (and one beyond) and write them at their deadline."""
        group, nxt = [first], next(events, None)
        while nxt is not None and nxt[0] == first[0]:
            group.append(nxt)
            nxt = next(events, None)
        args = (conn, tim, group, events, nxt, received)
        if first[0] > 0:
            self.timer.at(received + first[0], self._write_group, *args)
        else:
            self._write_group(*args)

    def _write_group(self, conn: _Conn, tim: dict, group: list, events: Iterator, nxt: tuple | None,
                     received: float) -> None:
        now = time.perf_counter()
        for _, _, mark, ntok in group:
            if mark == "role":
                tim["role"] = now
            elif mark == "content":
                tim["content"].append(now)
                tim["tokens"].append(ntok)
        conn._write(b"".join(b"%x\r\n%s\r\n" % (len(d), d) for _, d, _, _ in group) + (b"" if nxt else b"0\r\n\r\n"))
        if nxt:
            self._schedule(conn, tim, events, nxt, received)
        else:
            conn.done()

    # ---- routing -------------------------------------------------------------------------
    def _dispatch(self, method: str, path: str, headers: dict, body: bytes, received: float) -> Reply | Stream:
        routes = {("GET", "/v1/models"): self._models, ("GET", "/metrics"): self._metrics,
                  ("GET", "/_timings"): self._timings,
                  ("GET", "/metrics/prefill"): lambda h, b: self._phase_metrics("prefill"),
                  ("GET", "/metrics/decode"): lambda h, b: self._phase_metrics("decode"),
                  ("POST", "/v1/chat/completions"): lambda h, b: self._handle(h, b, chat=True),
                  ("POST", "/v1/completions"): lambda h, b: self._handle(h, b, chat=False)}
        self._received = received
        fn = routes.get((method, path))
        if fn is None:
            return _json(404, {"error": {"message": f"no route {method} {path}", "type": "NotFoundError",
                                         "param": None, "code": 404}})
        return fn(headers, body)

    # ---- helpers -------------------------------------------------------------------------
    def _error(self, status: int, message: str, type_: str, param: str | None = None,
               code: str | None = None) -> Reply:
        if status == 400 and self.broken.error_500:
            return Reply(500, b"Internal Server Error", "text/plain")
        return _json(status, {"error": {"message": message, "type": type_, "param": param, "code": code or status}})

    def _auth(self, headers: dict) -> Reply | None:
        if self.api_key is None or headers.get("authorization") == f"Bearer {self.api_key}":
            return None
        return _json(401, {"error": {"message": "Invalid API key", "type": "authentication_error",
                                     "param": None, "code": 401}})

    def _models(self, headers: dict, body: bytes) -> Reply:
        return self._auth(headers) or _json(200, {"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "pdops"}]})

    def _timings(self, headers: dict, body: bytes) -> Reply:
        """Server-side truth (time.perf_counter = CLOCK_MONOTONIC, comparable across processes)."""
        return _json(200, self.timings)

    def _metrics(self, headers: dict, body: bytes) -> Reply:
        """vLLM-named histograms of the stamped writes: TTFT from receipt to the first content
        write, ITL per token (a chunk's gap shared by its tokens, as an engine that emits tokens
        evenly would record), TPOT per request."""
        ttft, itl, tpot = [], [], []
        for t in list(self.timings.values()):
            c, n = t["content"], t["tokens"]
            if not c:
                continue
            ttft.append(c[0] - t["received"])
            for (a, b), m in zip(zip(c, c[1:]), n[1:]):
                itl += [(b - a) / m] * m
            if sum(n) > 1:
                tpot.append((c[-1] - c[0]) / (sum(n) - 1))
        out = ["# HELP fake_up up", "# TYPE fake_up gauge", "fake_up 1"]
        for name, vals in (("time_to_first_token_seconds", ttft), ("inter_token_latency_seconds", itl),
                           ("request_time_per_output_token_seconds", tpot)):
            out.append(f"# TYPE vllm:{name} histogram")
            out += [f'vllm:{name}_bucket{{le="{le}"}} {sum(v <= le for v in vals)}' for le in BUCKETS]
            out += [f'vllm:{name}_bucket{{le="+Inf"}} {len(vals)}', f"vllm:{name}_sum {sum(vals)}",
                    f"vllm:{name}_count {len(vals)}"]
        text = "\n".join(out) + "\n" + (self.pd.metrics_text() if self.pd else "")
        return Reply(200, text.encode(), "text/plain; version=0.0.4")

    def _phase_metrics(self, phase: str) -> Reply:
        """One phase's engines only: what one worker pod exports on Kubernetes (a source tagged #phase)."""
        text = self.pd.metrics_text(phase=phase) if self.pd else ""
        return Reply(200 if self.pd else 404, text.encode(), "text/plain; version=0.0.4")

    @staticmethod
    def _prompt_tokens(text: str) -> int:
        return max(1, len(text.split()))

    def _tokenized(self, body: dict, chat: bool, prompt: str) -> int:
        """vLLM's count: the chat template rendered with the generation prompt, then tokenized
        without special tokens; a completion prompt with them (vllm/renderers/base.py
        default_chat_tok_params, default_cmpl_tok_params)."""
        if not hasattr(self, "_tok"):
            from transformers import AutoTokenizer
            self._tok = AutoTokenizer.from_pretrained(self.tokenizer)
        if chat:
            text = self._tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
            return len(self._tok(text, add_special_tokens=False)["input_ids"])
        return len(self._tok(prompt)["input_ids"])

    def _gen_tokens(self, seed: int | None, idx: int, n: int) -> list[str]:
        # deterministic given (seed, choice index); gibberish, like a tiny random model
        s = (seed or 0) * 7919 + idx * 104729 + 17
        out = []
        for i in range(n):
            s = (s * 1103515245 + 12345) & 0x7FFFFFFF
            out.append(" " + WORDS[s % len(WORDS)])
        return out

    def _parse(self, headers: dict, raw: bytes, chat: bool):
        if (r := self._auth(headers)) is not None:
            return r, None
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except Exception:
            return self._error(400, "Invalid JSON body", "invalid_request_error"), None
        model = body.get("model")
        if model != self.model:
            return _json(404, {"error": {"message": f"The model `{model}` does not exist.",
                                         "type": "NotFoundError", "param": "model", "code": 404}}), None
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return self._error(400, "messages must be a non-empty list", "invalid_request_error",
                                   "messages"), None
            prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(map(str, prompt))
            if not isinstance(prompt, str):
                return self._error(400, "prompt is required", "invalid_request_error", "prompt"), None
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        ptoks = self._tokenized(body, chat, prompt) if self.tokenizer else self._prompt_tokens(prompt)
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or max_tokens < 1:
                return self._error(400, "max_tokens must be at least 1", "invalid_request_error",
                                   "max_tokens"), None
            if max_tokens + ptoks > self.context_len:
                return self._error(400, f"max_tokens too large for context length {self.context_len}",
                                   "invalid_request_error", "max_tokens"), None
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            return self._error(400, "n must be >= 1", "invalid_request_error", "n"), None
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        elif stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            return self._error(400, "stop must be a string or list", "invalid_request_error", "stop"), None
        return None, dict(body=body, prompt_tokens=ptoks, max_tokens=max_tokens, n=n, stop=stop or [])

    def _plan(self, p: dict, idx: int) -> tuple[list[str], str]:
        limit = self.tokens if p["max_tokens"] is None else min(self.tokens, p["max_tokens"])
        toks = self._gen_tokens(p["body"].get("seed"), idx, limit)
        finish = "length" if (p["max_tokens"] is not None and p["max_tokens"] <= self.tokens) else "stop"
        if p["stop"]:
            text = ""
            for i, t in enumerate(toks):
                cand = text + t
                hit = min((cand.find(s) for s in p["stop"] if s and s in cand), default=-1)
                if hit >= 0:
                    remainder = cand[:hit][len(text):]
                    toks = toks[:i] + ([remainder] if remainder else [])
                    finish = "stop"
                    break
                text = cand
        if self.broken.wrong_finish_reason:
            finish = "stop" if finish == "length" else "length"
        return toks, finish

    def _jitter(self, n: int) -> list[float]:
        """Due offsets of tokens 0..n-1 of one request under the lognormal jitter (seeded per request)."""
        import random
        self._jitter_n = getattr(self, "_jitter_n", 0) + 1
        rng = random.Random(self.jitter_seed * 1_000_003 + self._jitter_n)
        off = self.first_token_delay * rng.lognormvariate(0.0, self.ttft_spread)
        itl = self.inter_token_delay * rng.lognormvariate(0.0, self.itl_spread)
        out = [off]
        for _ in range(n - 1):
            off += itl * rng.lognormvariate(0.0, self.gap_spread)
            out.append(off)
        return out

    def _usage(self, prompt_tokens: int, completion: int) -> dict:
        total = prompt_tokens + completion + (3 if self.broken.inconsistent_usage else 0)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": total}

    def _logprobs(self, body: dict, chat: bool, toks: list[str]):
        if chat:
            if not body.get("logprobs"):
                return None
            k = body.get("top_logprobs") or 0
            return {"content": [{"token": t, "logprob": -1.0, "bytes": list(t.encode()),
                                 "top_logprobs": [{"token": t, "logprob": -1.0, "bytes": list(t.encode())}] * k}
                                for t in toks]}
        k = body.get("logprobs")
        if k is None:
            return None
        return {"tokens": toks, "token_logprobs": [-1.0] * len(toks),
                "top_logprobs": [{t: -1.0} for t in toks], "text_offset": list(range(len(toks)))}

    def _handle(self, headers: dict, raw: bytes, chat: bool) -> Reply | Stream:
        err, p = self._parse(headers, raw, chat)
        if err is not None:
            return err
        body = p["body"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        plans = [self._plan(p, i) for i in range(p["n"])]
        first = None
        if self.pd:   # the first token waits for a prefill slot, then a decode slot
            first = self.pd.admit(self._received, p["prompt_tokens"], max((len(t) for t, _ in plans), default=0),
                                  self.inter_token_delay)
        if not body.get("stream"):
            choices = []
            for i, (toks, finish) in enumerate(plans):
                text = "".join(toks)
                c = {"index": i, "finish_reason": finish, "logprobs": self._logprobs(body, chat, toks)}
                if body.get("return_token_ids"):   # vLLM's extension; golden tokens compare these ids
                    c["token_ids"] = [WORDS.index(t.strip()) if t.strip() in WORDS else len(WORDS) for t in toks]
                if chat:
                    c["message"] = {"role": "assistant", "content": text}
                else:
                    c["text"] = text
                choices.append(c)
            out = {"id": rid, "object": obj, "created": created, "model": self.model, "choices": choices}
            if not self.broken.missing_usage:
                out["usage"] = self._usage(p["prompt_tokens"], sum(len(t) for t, _ in plans))
            r = _json(200, out)
            r.delay = (self.first_token_delay if first is None else first) + self.inter_token_delay * max(0, self.tokens - 1)
            return r
        return Stream(rid, self._events(p, plans, chat, rid, created, first))

    def _events(self, p: dict, plans: list, chat: bool, rid: str, created: int,
                first: float | None = None) -> Iterator:
        body = p["body"]
        cobj = "chat.completion.chunk" if chat else "text_completion"

        def ev(off: float, choices: list, mark: str | None = None, ntok: int = 0, usage=None) -> tuple:
            d = {"id": rid, "object": cobj, "created": created, "model": self.model, "choices": choices}
            if usage is not None:
                d["usage"] = usage
            return off, b"data: " + json.dumps(d).encode() + b"\n\n", mark, ntok

        if chat and self.early_role_chunk:
            yield ev(0.0, [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                           for i in range(p["n"])], "role")
        maxlen = max((len(t) for t, _ in plans), default=0)
        tpc = max(1, self.tokens_per_chunk)
        first = self.first_token_delay if first is None else first
        off = first
        jit = self._jitter(maxlen) if (self.ttft_spread or self.itl_spread or self.gap_spread) else None
        for ci, start in enumerate(range(0, maxlen, tpc)):
            # absolute schedule (no drift): chunk ci is due at first_token_delay + ci*tpc*inter_token_delay
            off = first + ci * tpc * self.inter_token_delay if jit is None else jit[ci * tpc]
            choices = []
            for i, (toks, finish) in enumerate(plans):
                piece = toks[start:start + tpc]
                if not piece:
                    continue
                c = {"index": i, "finish_reason": None, "logprobs": self._logprobs(body, chat, piece)}
                if chat:
                    c["delta"] = {"content": "".join(piece)}
                    if ci == 0 and not self.early_role_chunk:
                        c["delta"]["role"] = "assistant"
                else:
                    c["text"] = "".join(piece)
                choices.append(c)
            yield ev(off, choices, "content", max(len(t[start:start + tpc]) for t, _ in plans))
        final = []
        for i, (toks, finish) in enumerate(plans):
            c = {"index": i, "finish_reason": finish, "logprobs": None}
            if chat:
                c["delta"] = {}
            else:
                c["text"] = ""
            final.append(c)
        yield ev(off, final)
        so = body.get("stream_options") or {}
        if so.get("include_usage") and not self.broken.missing_usage:
            yield ev(off, [], usage=self._usage(p["prompt_tokens"], sum(len(t) for t, _ in plans)))
        if not self.broken.missing_done:
            yield off, b"data: [DONE]\n\n", None, 0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


def main() -> None:  # pragma: no cover - used by scripts/bench_harness.py
    """Serve from --procs processes sharing one SO_REUSEPORT port; prints the port. Each process
    also answers on a port of its own, printed on the next line, for its /_timings."""
    import argparse
    import signal
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-token-delay", type=float, default=0.1)
    ap.add_argument("--inter-token-delay", type=float, default=0.02)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--procs", type=int, default=1)
    a = ap.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # sigwait, not death
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    lsock.bind(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    kids = []
    for _ in range(a.procs):
        r, w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(w)
            kids.append((pid, os.fdopen(r)))
            continue
        os.close(r)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        srv = KnownTimingServer(first_token_delay=a.first_token_delay, inter_token_delay=a.inter_token_delay,
                                tokens=a.tokens, tokens_per_chunk=a.tokens_per_chunk).start(s)
        os.write(w, f"{srv.port}\n".encode())
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        os._exit(0)
    lsock.close()
    print(port, " ".join(f.readline().strip() for _, f in kids), sep="\n", flush=True)
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        for pid, _ in kids:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)


if __name__ == "__main__":  # pragma: no cover
    main()
