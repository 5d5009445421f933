"""Candidate vs reference, and streamed vs non-streamed on each side: the list of differences.

Every comparison is on what a client sees: the HTTP status class and the OpenAI error shape,
the number of choices, per choice the token ids (vLLM's `return_token_ids`), text, finish and
stop reason, logprobs, tool calls and which fields are present, and the usage counts. An empty
list means the candidate answered as the reference did.
"""
from __future__ import annotations

import math
from typing import Any

from validation.diff.models import Answer, Choice, Side

# Logprobs are floats computed by different engines (prefill's KV, decode's step): equal within
# this. Measured on the tiny CPU model, P/D vs one engine: see docs/diff.md.
LOGPROB_TOL = 1e-3
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def status_class(a: Answer) -> str:
    return "no answer" if a.status is None else f"{a.status // 100}xx"


def _first_diff(a: list, b: list) -> int | None:
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return k if k is not None or len(a) == len(b) else min(len(a), len(b))


def approx(a: Any, b: Any, tol: float = LOGPROB_TOL) -> bool:
    """Structural equality with floats equal within `tol` (and -inf == -inf)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(approx(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(approx(x, y, tol) for x, y in zip(a, b, strict=True))
    return a == b


def _choice(c: Choice, r: Choice, where: str, keys: bool) -> list[str]:
    out = []
    if c.token_ids is not None and r.token_ids is not None:
        k = _first_diff(c.token_ids, r.token_ids)
        if k is not None:
            out.append(f"{where}token ids differ from position {k} (of {len(r.token_ids)}): "
                       f"{c.token_ids[k:k + 6]} vs reference {r.token_ids[k:k + 6]}")
    elif (c.token_ids is None) != (r.token_ids is None):
        out.append(f"{where}token_ids {'missing' if c.token_ids is None else 'present'} "
                   f"({'present' if r.token_ids is not None else 'missing'} on the reference)")
    if c.text != r.text and not any("token ids differ" in d for d in out):
        out.append(f"{where}text differs: {c.text[:60]!r} vs reference {r.text[:60]!r}")
    for field in ("finish_reason", "stop_reason"):
        if getattr(c, field) != getattr(r, field):
            out.append(f"{where}{field} {getattr(c, field)!r} vs reference {getattr(r, field)!r}")
    if (c.logprobs is None) != (r.logprobs is None):
        out.append(f"{where}logprobs {'missing' if c.logprobs is None else 'present'} "
                   f"({'present' if r.logprobs is not None else 'missing'} on the reference)")
    elif c.logprobs is not None and r.logprobs is not None and not approx(c.logprobs, r.logprobs):
        out.append(f"{where}logprobs differ beyond {LOGPROB_TOL}: {c.logprobs[:2]} vs reference {r.logprobs[:2]}")
    elif c.top_logprobs != r.top_logprobs:
        out.append(f"{where}top_logprobs tokens differ")
    for field in ("prompt_token_ids", "prompt_logprobs"):
        if not approx(getattr(c, field), getattr(r, field)):
            out.append(f"{where}{field} differ: {str(getattr(c, field))[:80]} "
                       f"vs reference {str(getattr(r, field))[:80]}")
    if not approx(c.tool_calls and [_tool(t) for t in c.tool_calls], r.tool_calls and [_tool(t) for t in r.tool_calls]):
        out.append(f"{where}tool_calls differ: {c.tool_calls} vs reference {r.tool_calls}")
    if keys:
        out += _fields(set(c.keys), set(r.keys), where + "choice ")
    return out


def _tool(call: Any) -> Any:
    """A tool call without its random id."""
    return {k: v for k, v in call.items() if k != "id"} if isinstance(call, dict) else call


def _fields(cand: set[str], ref: set[str], where: str) -> list[str]:
    out = []
    if ref - cand:
        out.append(f"{where}lacks field(s) the reference sends: {', '.join(sorted(ref - cand))}")
    if cand - ref:
        out.append(f"{where}adds field(s) the reference does not send: {', '.join(sorted(cand - ref))}")
    return out


def _usage(c: dict | None, r: dict | None, where: str) -> list[str]:
    if r is None:
        return []
    if c is None:
        return [f"{where}usage missing (the reference sends it)"]
    bad = [f"{k} {c.get(k)} vs {r.get(k)}" for k in USAGE_KEYS if c.get(k) != r.get(k)]
    return [f"{where}usage differs: " + ", ".join(bad)] if bad else []


def answers(c: Answer, r: Answer, where: str = "", keys: bool = True) -> list[str]:
    """How answer `c` differs from answer `r` (both to the same body, or a stream and its twin)."""
    if c.transport_error:
        return [f"{where}no answer: {c.transport_error}"]
    if status_class(c) != status_class(r):
        detail = f" ({c.error_message})" if c.error_message else ""
        return [f"{where}status {c.status} vs reference {r.status}{detail}"
                + (f"; reference said: {r.error_message}" if r.error_message else "")]
    if not c.ok:
        if r.error_shape_ok and not c.error_shape_ok:
            return [f"{where}error is not OpenAI-shaped ({{\"error\": {{\"message\", \"type\"}}}}): {c.excerpt[:120]}"]
        return []
    if c.error_message and not r.error_message:      # a 200 stream that carried an error event
        return [f"{where}error inside the answer: {c.error_message}"]
    out = _fields(set(c.keys), set(r.keys), where + "response ") if keys else []
    if len(c.choices) != len(r.choices):
        out.append(f"{where}{len(c.choices)} choices vs reference {len(r.choices)}")
    for cc, rc in zip(c.choices, r.choices, strict=False):  # a count mismatch is reported above
        out += _choice(cc, rc, f"{where}choice {rc.index}: ", keys)
    out += _usage(c.usage, r.usage, where)
    if not approx(c.prompt_token_ids, r.prompt_token_ids) and r.prompt_token_ids is not None:
        out.append(f"{where}prompt_token_ids differ")
    if not approx(c.prompt_logprobs, r.prompt_logprobs):
        out.append(f"{where}prompt_logprobs differ: {str(c.prompt_logprobs)[:80]} vs reference "
                   f"{str(r.prompt_logprobs)[:80]}")
    if c.stream and c.done is False and r.done:
        out.append(f"{where}stream did not end with data: [DONE]")
    return out


def consistent(side: Side) -> list[str]:
    """A side's streamed answer vs its own non-streamed answer (field names differ by design)."""
    if side.streamed is None:
        return []
    return answers(side.streamed, side.answer, "stream vs non-stream: ", keys=False)


def case(candidate: Side, reference: Side) -> tuple[list[str], list[str]]:
    """(differences that make the case `differs`, notes that do not)."""
    diffs = answers(candidate.answer, reference.answer)
    if candidate.streamed is not None and reference.streamed is not None:
        diffs += answers(candidate.streamed, reference.streamed, "streamed: ")
    mine, theirs = consistent(candidate), consistent(reference)
    notes = []
    if mine and not theirs:
        diffs += ["candidate " + d for d in mine]
    elif mine:  # the engine itself streams differently: not a P/D divergence, but worth a line
        notes = ["both sides: " + d for d in theirs]
    return diffs, notes
