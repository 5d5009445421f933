"""One request body to one endpoint, its answer normalised into an `Answer` (streamed or not).

Raw HTTP through httpx rather than the openai SDK: the suite must send the exact body of a case
(vLLM's extension fields, deliberately invalid values) and see the exact status and error body,
where the SDK validates, retries and raises its own exception types.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

from validation.diff.models import Answer, Api, Choice

PATHS = {"chat": "/chat/completions", "completions": "/completions"}
EXCERPT = 400


def _present(obj: dict, prefix: str = "") -> list[str]:
    """Names of the fields that carry a value (null and absent are the same to a client)."""
    return sorted(prefix + k for k, v in obj.items() if v is not None)


def _chat_logprobs(lp: Any) -> tuple[list, list] | None:
    if not isinstance(lp, dict) or lp.get("content") is None:
        return None
    content = lp["content"] or []
    return ([(e.get("token"), e.get("logprob")) for e in content],
            [[t.get("token") for t in e.get("top_logprobs") or []] for e in content])


def _completion_logprobs(lp: Any) -> tuple[list, list] | None:
    if not isinstance(lp, dict) or lp.get("tokens") is None:
        return None
    tops = [sorted(t) if isinstance(t, dict) else [] for t in lp.get("top_logprobs") or []]
    return list(zip(lp["tokens"], lp.get("token_logprobs") or [None] * len(lp["tokens"]), strict=False)), tops


def _choice(api: Api, raw: dict, delta: bool) -> Choice:
    lp = (_chat_logprobs if api == "chat" else _completion_logprobs)(raw.get("logprobs"))
    keys = _present(raw)
    if api == "chat":
        msg = raw.get("delta" if delta else "message") or {}
        text = msg.get("content") or ""
        keys += _present(msg, "message.")
        tools = msg.get("tool_calls") or None
    else:
        text, tools = raw.get("text") or "", None
    return Choice(index=raw.get("index", 0), text=text, token_ids=raw.get("token_ids"),
                  finish_reason=raw.get("finish_reason"), stop_reason=raw.get("stop_reason"),
                  logprobs=lp[0] if lp else None, top_logprobs=lp[1] if lp else None,
                  tool_calls=tools, prompt_token_ids=raw.get("prompt_token_ids"),
                  prompt_logprobs=raw.get("prompt_logprobs"), keys=keys)


def _error(answer: Answer, data: Any) -> None:
    err = data.get("error") if isinstance(data, dict) else None
    answer.error_shape_ok = isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err
    if isinstance(err, dict):
        answer.error_message = str(err.get("message"))[:300]
    elif isinstance(data, dict) and "detail" in data:
        answer.error_message = str(data["detail"])[:300]


def parse_body(api: Api, status: int, text: str) -> Answer:
    answer = Answer(status=status, excerpt=text[:EXCERPT])
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    answer.body = data
    if not 200 <= status < 300:
        _error(answer, data)
        return answer
    if not isinstance(data, dict):
        answer.error_message = "2xx answer is not a JSON object"
        return answer
    answer.keys = _present(data)
    answer.choices = [_choice(api, c, False) for c in data.get("choices") or [] if isinstance(c, dict)]
    answer.usage = data.get("usage")
    answer.prompt_token_ids = data.get("prompt_token_ids")
    answer.prompt_logprobs = data.get("prompt_logprobs")
    return answer


def _merge(into: Choice | None, part: Choice) -> Choice:
    if into is None:
        return part
    into.text += part.text
    if part.token_ids is not None:
        into.token_ids = (into.token_ids or []) + part.token_ids
    into.finish_reason = part.finish_reason or into.finish_reason
    into.stop_reason = part.stop_reason if part.stop_reason is not None else into.stop_reason
    if part.logprobs is not None:
        into.logprobs = (into.logprobs or []) + part.logprobs
        into.top_logprobs = (into.top_logprobs or []) + (part.top_logprobs or [])
    if part.tool_calls:
        into.tool_calls = (into.tool_calls or []) + part.tool_calls
    into.prompt_token_ids = into.prompt_token_ids or part.prompt_token_ids
    into.prompt_logprobs = into.prompt_logprobs or part.prompt_logprobs
    into.keys = sorted(set(into.keys) | set(part.keys))
    return into


def parse_stream(api: Api, lines: list[str]) -> Answer:
    """Server-sent events -> one Answer: per choice the concatenation of every chunk's pieces."""
    answer = Answer(stream=True, status=200, chunks=0, done=False, excerpt="\n".join(lines)[:EXCERPT])
    choices: dict[int, Choice] = {}
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            answer.done = True
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            answer.error_message = f"undecodable event: {payload[:100]}"
            continue
        answer.chunks = (answer.chunks or 0) + 1
        if isinstance(data, dict) and "error" in data:  # vLLM reports a failure mid-stream this way
            _error(answer, data)
            continue
        answer.keys = sorted(set(answer.keys) | set(_present(data)))
        answer.usage = data.get("usage") or answer.usage
        if answer.prompt_token_ids is None:
            answer.prompt_token_ids = data.get("prompt_token_ids")
        for raw in data.get("choices") or []:
            part = _choice(api, raw, True)
            choices[part.index] = _merge(choices.get(part.index), part)
    answer.choices = [choices[i] for i in sorted(choices)]
    return answer


def send(client: httpx.Client, base_url: str, api: Api, body: dict, api_key: str | None = None) -> Answer:
    """POST `body` as is; never raises: a failure to get any answer is `transport_error`."""
    url = base_url.rstrip("/") + PATHS[api]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    try:
        if body.get("stream"):
            with client.stream("POST", url, json=body, headers=headers) as resp:
                if resp.status_code != 200:
                    answer = parse_body(api, resp.status_code, resp.read().decode(errors="replace"))
                    answer.stream = True
                else:
                    answer = parse_stream(api, list(resp.iter_lines()))
        else:
            resp = client.post(url, json=body, headers=headers)
            answer = parse_body(api, resp.status_code, resp.text)
    except httpx.HTTPError as exc:
        answer = Answer(stream=bool(body.get("stream")), transport_error=f"{type(exc).__name__}: {exc}"[:300])
    answer.seconds = round(time.monotonic() - started, 3)
    return answer
