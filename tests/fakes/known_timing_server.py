"""An OpenAI-compatible aiohttp server with known timings, for testing the latency harness and
the compatibility suite. Runs on 127.0.0.1 on an ephemeral port in a background thread.

    with KnownTimingServer(first_token_delay=0.1, inter_token_delay=0.02, tokens=16) as srv:
        srv.base_url  # http://127.0.0.1:PORT/v1

"Broken" switches make it misbehave in one specific way each, so tests can prove the compat
suite catches it.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass
class Broken:
    missing_usage: bool = False        # no usage chunk even with include_usage; no usage non-stream
    missing_done: bool = False         # stream ends without data: [DONE]
    wrong_finish_reason: bool = False  # "stop" even when max_tokens hit
    error_500: bool = False            # 500 instead of 400 on bad input
    inconsistent_usage: bool = False   # total_tokens != prompt + completion


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
    broken: Broken = field(default_factory=Broken)
    host: str = "127.0.0.1"

    port: int = 0
    # per response id: perf_counter times of receipt, role chunk, and every content chunk write
    timings: dict = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> "KnownTimingServer":
        ready = threading.Event()
        err: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start())
            except BaseException as e:  # pragma: no cover
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="known-timing-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/_timings", self._timings)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, backlog=4096)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> "KnownTimingServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- helpers -------------------------------------------------------------------------
    def _error(self, status: int, message: str, type_: str, param: str | None = None,
               code: str | None = None) -> web.Response:
        if status == 400 and self.broken.error_500:
            return web.Response(status=500, text="Internal Server Error")
        return web.json_response(
            {"error": {"message": message, "type": type_, "param": param, "code": code or status}},
            status=status)

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.api_key is None:
            return None
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Invalid API key", "type": "authentication_error",
                                                "param": None, "code": 401}}, status=401)
        return None

    async def _models(self, request: web.Request) -> web.Response:
        if (r := self._auth(request)) is not None:
            return r
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "pdops"}]})

    async def _timings(self, request: web.Request) -> web.Response:
        """Server-side truth (time.perf_counter = CLOCK_MONOTONIC, comparable across processes)."""
        return web.json_response(self.timings)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="# HELP fake_up up\n# TYPE fake_up gauge\nfake_up 1\n")

    @staticmethod
    def _prompt_tokens(text: str) -> int:
        return max(1, len(text.split()))

    def _gen_tokens(self, seed: int | None, idx: int, n: int) -> list[str]:
        # deterministic given (seed, choice index); gibberish, like a tiny random model
        s = (seed or 0) * 7919 + idx * 104729 + 17
        out = []
        for i in range(n):
            s = (s * 1103515245 + 12345) & 0x7FFFFFFF
            out.append(" " + WORDS[s % len(WORDS)])
        return out

    async def _parse(self, request: web.Request, chat: bool):
        if (r := self._auth(request)) is not None:
            return r, None
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except Exception:
            return self._error(400, "Invalid JSON body", "invalid_request_error"), None
        model = body.get("model")
        if model != self.model:
            return web.json_response({"error": {"message": f"The model `{model}` does not exist.",
                                                "type": "NotFoundError", "param": "model", "code": 404}},
                                     status=404), None
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
        ptoks = self._prompt_tokens(prompt)
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

    async def _chat(self, request):
        return await self._handle(request, chat=True)

    async def _completions(self, request):
        return await self._handle(request, chat=False)

    async def _handle(self, request: web.Request, chat: bool):
        received = time.perf_counter()
        err, p = await self._parse(request, chat)
        if err is not None:
            return err
        body = p["body"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        plans = [self._plan(p, i) for i in range(p["n"])]
        if not body.get("stream"):
            await asyncio.sleep(self.first_token_delay + self.inter_token_delay * max(0, self.tokens - 1))
            choices = []
            for i, (toks, finish) in enumerate(plans):
                text = "".join(toks)
                c = {"index": i, "finish_reason": finish, "logprobs": self._logprobs(body, chat, toks)}
                if chat:
                    c["message"] = {"role": "assistant", "content": text}
                else:
                    c["text"] = text
                choices.append(c)
            out = {"id": rid, "object": obj, "created": created, "model": self.model, "choices": choices}
            if not self.broken.missing_usage:
                out["usage"] = self._usage(p["prompt_tokens"], sum(len(t) for t, _ in plans))
            return web.json_response(out)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cobj = "chat.completion.chunk" if chat else "text_completion"

        async def send(choices: list, usage=None) -> None:
            d = {"id": rid, "object": cobj, "created": created, "model": self.model, "choices": choices}
            if usage is not None:
                d["usage"] = usage
            await resp.write(b"data: " + json.dumps(d).encode() + b"\n\n")

        t0 = time.perf_counter()
        tim = self.timings[rid] = {"received": received, "role": None, "content": []}
        if chat and self.early_role_chunk:
            tim["role"] = time.perf_counter()
            await send([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        for i in range(p["n"])])
        maxlen = max((len(t) for t, _ in plans), default=0)
        tpc = max(1, self.tokens_per_chunk)
        chunk_starts = list(range(0, maxlen, tpc))
        for ci, start in enumerate(chunk_starts):
            # absolute schedule (no drift): chunk ci is due at first_token_delay + ci*tpc*inter_token_delay
            due = t0 + self.first_token_delay + ci * tpc * self.inter_token_delay
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
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
            if choices:
                tim["content"].append(time.perf_counter())
                await send(choices)
        final = []
        for i, (toks, finish) in enumerate(plans):
            c = {"index": i, "finish_reason": finish, "logprobs": None}
            if chat:
                c["delta"] = {}
            else:
                c["text"] = ""
            final.append(c)
        await send(final)
        so = body.get("stream_options") or {}
        if so.get("include_usage") and not self.broken.missing_usage:
            await send([], usage=self._usage(p["prompt_tokens"], sum(len(t) for t, _ in plans)))
        if not self.broken.missing_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:  # pragma: no cover - used by scripts/bench_harness.py
    import argparse
    import signal
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-token-delay", type=float, default=0.1)
    ap.add_argument("--inter-token-delay", type=float, default=0.02)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    srv = KnownTimingServer(first_token_delay=a.first_token_delay, inter_token_delay=a.inter_token_delay,
                            tokens=a.tokens).start()
    print(srv.port, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    srv.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
