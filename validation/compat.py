"""OpenAI-compatibility suite, using the official `openai` SDK as the client (plus raw aiohttp
where the SDK hides the wire: [DONE], bad JSON bodies).

Each named case passes, fails or skips with evidence (request, response excerpt). The real target
may be a tiny random model: it emits gibberish and may never emit EOS, so no case asserts on the
content of text; the stop-string case picks its stop string from an earlier deterministic output.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
from openai.types.chat import ChatCompletionMessageParam

from validation.reports.compat import CompatCase, CompatReport, Status

PROMPT = "Write a few words about the sea."
MAXTOK = 8


class Skip(Exception):
    pass


class Fail(AssertionError):
    pass


def check(cond: object, msg: str) -> None:  # any truthy value passes (a list: non-empty)
    if not cond:
        raise Fail(msg)


def _excerpt(obj: Any, n: int = 600) -> str:
    try:
        if hasattr(obj, "model_dump"):
            obj = obj.model_dump()
        s = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    except Exception:  # noqa: BLE001
        s = repr(obj)
    return s[:n]


@dataclass
class Ctx:
    base_url: str
    model: str
    api_key: str | None
    api_key_required: bool = False
    timeout: float = 60.0
    concurrency: int = 8
    cache: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)
    clients: dict = field(default_factory=dict)

    def client(self, api_key: str | None = None) -> openai.AsyncOpenAI:
        key = api_key or self.api_key or "EMPTY"
        if key not in self.clients:
            self.clients[key] = openai.AsyncOpenAI(base_url=self.base_url, api_key=key,
                                                   timeout=self.timeout, max_retries=0)
        return self.clients[key]

    def note(self, request: Any = None, response: Any = None) -> None:
        if request is not None:
            self.evidence["request"] = _excerpt(request, 400)
        if response is not None:
            self.evidence["response"] = _excerpt(response)

    def headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def _msgs(text: str = PROMPT) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


async def _raw_post(ctx: Ctx, path: str, data: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ctx.timeout),
                                     read_bufsize=4 * 1024 * 1024) as s:
        async with s.post(ctx.base_url.rstrip("/") + path, data=data, headers=headers or ctx.headers()) as r:
            return r.status, await r.read()


def _check_openai_error(status: int, body: bytes, want: int | tuple[int, ...]) -> dict:
    want = (want,) if isinstance(want, int) else want
    check(status < 500, f"server error {status} (must never 5xx on client input): {body[:200]!r}")
    check(status in want, f"status {status}, want {want}: {body[:200]!r}")
    try:
        d = json.loads(body)
    except ValueError:
        raise Fail(f"error body is not JSON: {body[:200]!r}") from None
    check(isinstance(d, dict) and isinstance(d.get("error"), dict), f"not OpenAI-shaped error: {d}")
    check(isinstance(d["error"].get("message"), str) and d["error"]["message"], "error.message missing")
    return d


def _check_usage(u: Any, max_tokens: int | None = None) -> None:
    check(u is not None, "usage missing")
    check(isinstance(u.prompt_tokens, int) and u.prompt_tokens > 0, f"prompt_tokens {u.prompt_tokens}")
    check(isinstance(u.completion_tokens, int) and u.completion_tokens >= 0, "completion_tokens")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens,
          f"total_tokens {u.total_tokens} != {u.prompt_tokens} + {u.completion_tokens}")
    if max_tokens is not None:
        check(u.completion_tokens <= max_tokens, f"completion_tokens {u.completion_tokens} > max_tokens {max_tokens}")


# ---------------------------------------------------------------------------------------------
# cases
async def models_list(ctx: Ctx) -> None:
    r = await ctx.client().models.list()
    ids = [m.id for m in r.data]
    ctx.note("GET /models", {"ids": ids})
    check(ctx.model in ids, f"{ctx.model} not in {ids}")


async def unknown_model_404(ctx: Ctx) -> None:
    body = {"model": ctx.model + "-does-not-exist", "messages": _msgs(), "max_tokens": 2}
    status, resp = await _raw_post(ctx, "/chat/completions", json.dumps(body).encode())
    ctx.note(body, resp.decode("utf-8", "replace"))
    _check_openai_error(status, resp, 404)


def _check_envelope(r, obj: str, model: str) -> None:
    """The fields every non-streamed response carries, chat or completions alike."""
    check(isinstance(r.id, str) and r.id, "id")
    check(r.object == obj, f"object {r.object}")
    check(isinstance(r.created, int) and r.created > 0, "created")
    check(r.model == model, f"model {r.model}")
    check(len(r.choices) == 1 and r.choices[0].index == 0, "choices[].index")


async def chat_nonstream_shape(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=MAXTOK, temperature=0, seed=1)
    r = await ctx.client().chat.completions.create(**req)
    ctx.note(req, r)
    _check_envelope(r, "chat.completion", ctx.model)
    check(r.choices[0].message.role == "assistant", "message.role")
    check(isinstance(r.choices[0].message.content, str), "message.content")
    _check_usage(r.usage, MAXTOK)
    if r.usage.completion_tokens == MAXTOK:
        check(r.choices[0].finish_reason == "length",
              f"finish_reason {r.choices[0].finish_reason!r} but max_tokens was hit")
    else:
        check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason!r}")
    ctx.cache["chat_text"] = r.choices[0].message.content


async def completions_nonstream_shape(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, prompt=PROMPT, max_tokens=MAXTOK, temperature=0, seed=1)
    r = await ctx.client().completions.create(**req)
    ctx.note(req, r)
    _check_envelope(r, "text_completion", ctx.model)
    check(isinstance(r.choices[0].text, str), "text")
    _check_usage(r.usage, MAXTOK)
    if r.usage.completion_tokens == MAXTOK:
        check(r.choices[0].finish_reason == "length",
              f"finish_reason {r.choices[0].finish_reason!r} but max_tokens was hit")
    ctx.cache["completion_text"] = r.choices[0].text


async def finish_reason_length(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=3, temperature=0, seed=1)
    r = await ctx.client().chat.completions.create(**req)
    ctx.note(req, r)
    check(r.usage is not None, "usage missing")
    if r.usage.completion_tokens < 3:
        raise Skip("model stopped before max_tokens; cannot test length")
    check(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason!r}, want length")


async def _deterministic_text(ctx: Ctx, n: int = 12) -> str:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=n, temperature=0, seed=7)
    r = await ctx.client().chat.completions.create(**req)
    return r.choices[0].message.content or ""


def _pick_stop(text: str) -> str | None:
    # a substring that appears after a non-empty prefix; avoid whitespace-only stops
    words = text.split()
    for w in words[1:]:
        if len(w) >= 2 and text.find(w) > 0:
            return w
    if len(text) >= 4:
        mid = text[len(text) // 2:len(text) // 2 + 2]
        if mid.strip():
            return mid
    return None


async def stop_string(ctx: Ctx) -> None:
    base = await _deterministic_text(ctx, 16)
    stop = _pick_stop(base)
    if stop is None:
        raise Skip(f"deterministic output too short to pick a stop string: {base!r}")
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=16, temperature=0, seed=7, stop=stop)
    r = await ctx.client().chat.completions.create(**req)
    ctx.note(req, {"baseline": base, "with_stop": r.choices[0].message.content,
                   "finish_reason": r.choices[0].finish_reason})
    out = r.choices[0].message.content or ""
    check(stop not in out, f"stop string {stop!r} present in output")
    check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason!r}, want stop")
    check(len(out) < len(base), "output not shortened by stop")


async def stop_list(ctx: Ctx) -> None:
    base = await _deterministic_text(ctx, 16)
    stop = _pick_stop(base)
    if stop is None:
        raise Skip("deterministic output too short to pick a stop string")
    stops = ["\u2603never\u2603", stop]
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=16, temperature=0, seed=7, stop=stops)
    r = await ctx.client().chat.completions.create(**req)
    out = r.choices[0].message.content or ""
    ctx.note(req, {"baseline": base, "with_stop": out, "finish_reason": r.choices[0].finish_reason})
    check(stop not in out, f"stop string {stop!r} present")
    check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason!r}")


async def determinism(ctx: Ctx) -> None:
    a = await _deterministic_text(ctx)
    b = await _deterministic_text(ctx)
    ctx.note("2x temperature=0 seed=7", {"a": a, "b": b})
    check(a == b, "temperature=0 outputs differ")


async def seed(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=MAXTOK, temperature=1.0, seed=1234)
    c = ctx.client()
    a = (await c.chat.completions.create(**req)).choices[0].message.content
    b = (await c.chat.completions.create(**req)).choices[0].message.content
    ctx.note(req, {"a": a, "b": b})
    check(a == b, "same seed at temperature=1 gave different outputs")


async def n_choices(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=4, n=2, temperature=1.0, seed=3)
    r = await ctx.client().chat.completions.create(**req)
    ctx.note(req, r)
    check(sorted(c.index for c in r.choices) == [0, 1], f"indices {[c.index for c in r.choices]}")
    _check_usage(r.usage)
    check(r.usage.completion_tokens <= 8, "completion_tokens > n*max_tokens")


async def logprobs(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=4, logprobs=True, top_logprobs=2,
                               temperature=0)
    r = await ctx.client().chat.completions.create(**req)
    ctx.note(req, r)
    lp = r.choices[0].logprobs
    check(lp is not None and lp.content, "logprobs.content missing")
    for t in lp.content:
        check(isinstance(t.logprob, float) and t.logprob <= 0.0, f"logprob {t.logprob}")
        check(len(t.top_logprobs) <= 2 and len(t.top_logprobs) >= 1, f"top_logprobs len {len(t.top_logprobs)}")


async def _stream_chat(ctx: Ctx, req: dict) -> tuple[list, str]:
    stream = await ctx.client().chat.completions.create(stream=True, **req)
    chunks = []
    async for ch in stream:
        chunks.append(ch)
    text = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    return chunks, text


async def chat_stream_shape(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=MAXTOK, temperature=0, seed=1)
    chunks, text = await _stream_chat(ctx, req)
    ctx.note(req, [c.model_dump() for c in chunks[:3]])
    check(chunks, "no chunks")
    ids = {c.id for c in chunks}
    check(len(ids) == 1, f"chunk ids differ: {ids}")
    for c in chunks:
        check(c.object == "chat.completion.chunk", f"object {c.object}")
        check(c.model == ctx.model, f"model {c.model}")
        for ch in c.choices:
            check(ch.index == 0, f"index {ch.index}")
    finals = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    check(len(finals) == 1, f"finish_reason seen {len(finals)} times")
    check(finals[0] in ("stop", "length"), f"finish_reason {finals[0]!r}")
    ref = ctx.cache.get("chat_text")
    if ref is None:
        ref = (await ctx.client().chat.completions.create(**req)).choices[0].message.content
    check(text == ref, f"streamed text differs from non-streamed: {text[:80]!r} vs {ref[:80]!r}")


async def completions_stream_shape(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, prompt=PROMPT, max_tokens=MAXTOK, temperature=0, seed=1)
    stream = await ctx.client().completions.create(stream=True, **req)
    chunks = [c async for c in stream]
    ctx.note(req, [c.model_dump() for c in chunks[:3]])
    check(chunks, "no chunks")
    for c in chunks:
        check(c.object == "text_completion", f"object {c.object}")
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ref = ctx.cache.get("completion_text")
    if ref is None:
        ref = (await ctx.client().completions.create(**req)).choices[0].text
    check(text == ref, "streamed text differs from non-streamed")


async def stream_done(ctx: Ctx) -> None:
    body = {"model": ctx.model, "messages": _msgs(), "max_tokens": 4, "stream": True}
    status, resp = await _raw_post(ctx, "/chat/completions", json.dumps(body).encode())
    events = [e for e in resp.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    ctx.note(body, resp[-300:].decode("utf-8", "replace"))
    check(status == 200, f"status {status}")
    check(events, "empty stream")
    for e in events[:-1]:
        check(e.startswith(b"data:"), f"event not data: {e[:80]!r}")
        json.loads(e[5:])
    check(events[-1].strip() == b"data: [DONE]", f"last event {events[-1][:80]!r}, want data: [DONE]")


async def stream_include_usage(ctx: Ctx) -> None:
    req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(), max_tokens=MAXTOK, temperature=0,
               stream_options={"include_usage": True})
    chunks, _ = await _stream_chat(ctx, req)
    usage = [c.usage for c in chunks if c.usage is not None]
    ctx.note(req, chunks[-1].model_dump() if chunks else None)
    check(usage, "no usage chunk with include_usage")
    check(chunks[-1].usage is not None and not chunks[-1].choices, "usage not in a final chunk with empty choices")
    _check_usage(usage[-1], MAXTOK)


async def bad_negative_max_tokens(ctx: Ctx) -> None:
    body = {"model": ctx.model, "messages": _msgs(), "max_tokens": -1}
    status, resp = await _raw_post(ctx, "/chat/completions", json.dumps(body).encode())
    ctx.note(body, resp.decode("utf-8", "replace"))
    _check_openai_error(status, resp, (400, 422))


async def bad_max_tokens_over_context(ctx: Ctx) -> None:
    body = {"model": ctx.model, "messages": _msgs(), "max_tokens": 10_000_000}
    status, resp = await _raw_post(ctx, "/chat/completions", json.dumps(body).encode())
    ctx.note(body, resp.decode("utf-8", "replace"))
    _check_openai_error(status, resp, (400, 422))


async def bad_json_body(ctx: Ctx) -> None:
    data = b'{"model": "' + ctx.model.encode() + b'", "messages": [ '
    status, resp = await _raw_post(ctx, "/chat/completions", data)
    ctx.note(data.decode(), resp.decode("utf-8", "replace"))
    _check_openai_error(status, resp, (400, 422))


async def auth_401(ctx: Ctx) -> None:
    if not ctx.api_key_required:
        raise Skip("API key not required by policy")
    try:
        r = await ctx.client(api_key="definitely-wrong-key").models.list()
    except openai.AuthenticationError as e:
        ctx.note("GET /models with a wrong key", str(e))
        return
    ctx.note("GET /models with a wrong key", r)
    raise Fail("request with a wrong API key succeeded")


async def concurrent_streams(ctx: Ctx) -> None:
    n = ctx.concurrency
    # each stream is asked with its own seed; reference is the same request non-streamed
    async def one(i: int) -> tuple[int, str, str, set]:
        req: dict[str, Any] = dict(model=ctx.model, messages=_msgs(f"{PROMPT} #{i}"), max_tokens=6, temperature=0,
                                   seed=100 + i)
        chunks, text = await _stream_chat(ctx, req)
        return i, text, chunks[0].id if chunks else "", {c.id for c in chunks}

    refs = await asyncio.gather(*(ctx.client().chat.completions.create(
        model=ctx.model, messages=_msgs(f"{PROMPT} #{i}"), max_tokens=6, temperature=0, seed=100 + i)
        for i in range(n)))
    res = await asyncio.gather(*(one(i) for i in range(n)))
    ctx.note(f"{n} parallel streams", [r[1][:40] for r in res])
    ids = [r[2] for r in res]
    check(len(set(ids)) == n, "streams share ids")
    for (i, text, _, idset), ref in zip(res, refs, strict=True):
        check(len(idset) == 1, f"stream {i} mixes chunk ids {idset}")
        check(text == ref.choices[0].message.content, f"stream {i} text differs from its reference (cross-talk?)")


CASES: dict[str, Callable[[Ctx], Any]] = {
    "models_list": models_list,
    "unknown_model_404": unknown_model_404,
    "chat_nonstream_shape": chat_nonstream_shape,
    "completions_nonstream_shape": completions_nonstream_shape,
    "finish_reason_length": finish_reason_length,
    "chat_stream_shape": chat_stream_shape,
    "completions_stream_shape": completions_stream_shape,
    "stream_done": stream_done,
    "stream_include_usage": stream_include_usage,
    "stop_string": stop_string,
    "stop_list": stop_list,
    "determinism": determinism,
    "seed": seed,
    "n_choices": n_choices,
    "logprobs": logprobs,
    "bad_negative_max_tokens": bad_negative_max_tokens,
    "bad_max_tokens_over_context": bad_max_tokens_over_context,
    "bad_json_body": bad_json_body,
    "auth_401": auth_401,
    "concurrent_streams": concurrent_streams,
}


async def run_suite(base_url: str, model: str, api_key: str | None = None, optional: Collection[str] = (),
                    api_key_required: bool = False, only: list[str] | None = None,
                    progress: Callable[[str], None] | None = None, timeout: float = 60.0) -> CompatReport:
    results: list[CompatCase] = []
    cache: dict = {}
    clients: dict = {}
    for name, fn in CASES.items():
        if only and name not in only:
            continue
        ctx = Ctx(base_url=base_url, model=model, api_key=api_key, api_key_required=api_key_required,
                  cache=cache, clients=clients, timeout=timeout)
        t = time.perf_counter()
        status: Status = "pass"
        detail = ""
        try:
            await fn(ctx)
        except Skip as e:
            status, detail = "skip", str(e)
        except Fail as e:
            status, detail = "fail", str(e)
        except openai.APIStatusError as e:
            status, detail = "fail", f"{type(e).__name__} {e.status_code}: {str(e)[:300]}"
        except Exception as e:  # noqa: BLE001
            status, detail = "fail", f"{type(e).__name__}: {e}"[:400]
            ctx.evidence.setdefault("traceback", traceback.format_exc(limit=3)[-600:])
        r = CompatCase(name=name, status=status, required=name not in optional, detail=detail,
                       duration_s=round(time.perf_counter() - t, 3), evidence=ctx.evidence)
        results.append(r)
        if progress:
            took = f" ({r.duration_s:.0f} s)" if (r.duration_s or 0) >= 2 else ""   # a slow case says so
            progress(f"[compat] {name}: {status}{took}{' - ' + detail if detail else ''}")
    for c in clients.values():
        await c.close()
    return CompatReport.of(base_url, model, results)


def run(base_url: str, model: str, **kw: Any) -> CompatReport:
    # Ray Serve LLM sets the root logger to INFO; one line per request from the SDK's HTTP client
    # (httpx2 in openai 2.x, httpx before) would bury the progress lines (seen: thousands per release).
    for noisy in ("httpx2", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return asyncio.run(run_suite(base_url, model, **kw))


def table(result: CompatReport) -> str:
    w = max((len(c.name) for c in result.cases), default=4)
    lines = [f"{'case'.ljust(w)}  status  req  detail", f"{'-' * w}  ------  ---  ------"]
    for c in result.cases:
        lines.append(f"{c.name.ljust(w)}  {c.status.ljust(6)}  {'yes' if c.required else 'no ':3}  "
                     f"{c.detail[:100]}")
    lines.append(f"passed {result.passed}, failed {result.failed}, skipped {result.skipped}; "
                 f"required failures: {', '.join(result.blocking()) or 'none'}")
    return "\n".join(lines)
