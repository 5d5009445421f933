"""A deterministic engine for `pdops diff` tests, on the known-timing server's HTTP layer.

Token ids are a function of (prompt, seed, choice) only, so two instances answer every body
identically — the "same engine twice" of the no-false-divergence test. `Plant` makes one instance
diverge in exactly one way, as a P/D candidate can:

- wrong_tokens_on_prompt=1: the second prompt of a completions batch gets other tokens (HTTP 200);
- status_500_on="logit_bias": a 500 whenever the body carries that parameter;
- drop_field="logprobs": that choice field is never sent;
- stream_tokens_short=True: a stream ends one token early (stream != non-stream on that side).
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field

from tests.fakes.known_timing_server import WORDS, KnownTimingServer, Reply, Stream, _json


@dataclass
class Plant:
    wrong_tokens_on_prompt: int | None = None
    status_500_on: str | None = None
    drop_field: str | None = None
    stream_tokens_short: bool = False


def _ids(prompt: str, seed, choice: int, n: int) -> list[int]:
    h = int(hashlib.sha256(f"{prompt}|{seed}|{choice}".encode()).hexdigest()[:8], 16)
    return [3 + (h + 7919 * k) % 4093 for k in range(n)]


@dataclass
class DiffFake(KnownTimingServer):
    first_token_delay: float = 0.0
    inter_token_delay: float = 0.0
    tokens: int = 8
    plant: Plant = field(default_factory=Plant)

    def _handle(self, headers: dict, raw: bytes, chat: bool) -> Reply | Stream:
        err, p = self._parse(headers, raw, chat)
        if err is not None:
            return err
        body = p["body"]
        if self.plant.status_500_on and self.plant.status_500_on in body:
            return Reply(500, b"Internal Server Error", "text/plain")
        if body.get("temperature", 1) == 0 and p["n"] > 1:
            return self._error(400, "n>1 needs temperature>0", "BadRequestError", "n")
        prompt = body["messages"] if chat else body["prompt"]
        batch = not chat and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
        prompts = [json.dumps(x) for x in prompt] if batch else [json.dumps(prompt)]
        limit = min(self.tokens, p["max_tokens"] or self.tokens)
        choices = []
        for i, prompt in enumerate(prompts):
            for j in range(p["n"]):
                ids = _ids(prompt, body.get("seed"), j, limit)
                if i == self.plant.wrong_tokens_on_prompt:
                    ids = [t + 1 for t in ids]
                choices.append((len(choices), ids))
        usage = self._usage(sum(self._prompt_tokens(x) for x in prompts), sum(len(ids) for _, ids in choices))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if body.get("stream"):
            return Stream(rid, self._chunks(body, chat, rid, choices, usage))
        out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
               "model": self.model, "usage": usage,
               "choices": [self._choice(body, chat, k, ids, "length", delta=False) for k, ids in choices]}
        return _json(200, out)

    def _choice(self, body: dict, chat: bool, index: int, ids: list[int], finish: str | None, delta: bool) -> dict:
        text = "".join(" " + WORDS[t % len(WORDS)] for t in ids)
        c: dict = {"index": index, "finish_reason": finish, "token_ids": ids if body.get("return_token_ids") else None}
        toks = [" " + WORDS[t % len(WORDS)] for t in ids]
        c["logprobs"] = self._logprobs(body, chat, toks) if toks else None
        if chat:
            c["delta" if delta else "message"] = {"role": "assistant", "content": text} if not delta else {"content": text}
        else:
            c["text"] = text
        if self.plant.drop_field:
            c.pop(self.plant.drop_field, None)
        return c

    def _chunks(self, body: dict, chat: bool, rid: str, choices: list, usage: dict):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def ev(choice_list: list, **extra) -> tuple:
            d = {"id": rid, "object": obj, "created": int(time.time()), "model": self.model, "choices": choice_list,
                 **extra}
            return 0.0, b"data: " + json.dumps(d).encode() + b"\n\n", "content", 1

        longest = max((len(ids) for _, ids in choices), default=0)
        for k in range(longest - (1 if self.plant.stream_tokens_short else 0)):
            yield ev([self._choice(body, chat, i, ids[k:k + 1], None, delta=True) for i, ids in choices if k < len(ids)])
        yield ev([self._choice(body, chat, i, [], "length", delta=True) for i, _ in choices])
        if (body.get("stream_options") or {}).get("include_usage"):
            yield ev([], usage=usage)
        yield 0.0, b"data: [DONE]\n\n", None, 0
