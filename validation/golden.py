"""Golden tokens: the P/D candidate must answer exactly as one non-disaggregated engine of the same
model does (temperature 0, fixed seed). A KV layout or transfer bug returns HTTP 200 with the wrong
tokens; no latency or compatibility check notices that, this one does.

Token ids come from vLLM's `return_token_ids` extension of /v1/completions, so the comparison is
on ids, not on re-tokenised text.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any

from validation.reports.release import GoldenCase, GoldenReport

SEED = 1234
WORDS = ("prefill decode cache tensor stream token engine route gate canary stable release "
         "latency replica node batch queue transfer layer block window").split()


def prompts(n: int) -> list[str]:
    """Deterministic prompts of growing length (about 8 to 8+24n words), made locally."""
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8 + 24 * i)]
        out.append(f"Prompt {i}: " + " ".join(words))
    return out


def complete(base_url: str, model: str, prompt: str, max_tokens: int, api_key: str | None = None,
             timeout: float = 120.0) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": SEED,
            "ignore_eos": True, "return_token_ids": True}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(base_url.rstrip("/") + "/completions", data=json.dumps(body).encode(),  # noqa: S310
                                 headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - operator-given endpoint
        choice = json.loads(resp.read())["choices"][0]
    return {"token_ids": choice.get("token_ids"), "text": choice.get("text", ""),
            "finish_reason": choice.get("finish_reason")}


def collect(base_url: str, model: str, texts: list[str], max_tokens: int, api_key: str | None = None,
            timeout: float = 120.0) -> list[dict]:
    """Answers in prompt order; a failed request is kept as {"error": ...} (a mismatch, not a crash)."""
    out = []
    for t in texts:
        try:
            out.append(complete(base_url, model, t, max_tokens, api_key, timeout))
        except (OSError, ValueError, LookupError) as exc:  # HTTP errors, timeouts, resets, bad JSON
            out.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
    return out


def compare(reference: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> GoldenReport:
    """Per prompt: equal token ids, or where they first differ. `ok` only when every prompt matches."""
    cases: list[dict[str, Any]] = []
    for i, (ref, cand) in enumerate(zip(reference, candidate, strict=False)):
        r, c = ref.get("token_ids"), cand.get("token_ids")
        if cand.get("error") or ref.get("error"):
            side, failed = ("candidate", cand) if cand.get("error") else ("reference", ref)
            cases.append({"prompt": i, "ok": False, "problem": f"{side} request failed: {failed['error']}"})
            continue
        if r is None or c is None:
            cases.append({"prompt": i, "ok": False, "problem": "no token_ids in the "
                          + ("reference" if r is None else "candidate") + " answer (return_token_ids unsupported?)"})
            continue
        first = next((k for k, (a, b) in enumerate(zip(r, c, strict=False)) if a != b), None)
        if first is None and len(r) != len(c):
            first = min(len(r), len(c))
        case = {"prompt": i, "ok": first is None, "tokens": len(r)}
        if first is not None:
            case.update(first_difference=first, reference=r[first:first + 8], candidate=c[first:first + 8])
        cases.append(case)
    if len(reference) != len(candidate):
        cases.append({"prompt": min(len(reference), len(candidate)), "ok": False,
                      "problem": f"{len(reference)} reference answers, {len(candidate)} candidate answers"})
    matched = sum(c["ok"] for c in cases)
    return GoldenReport(ok=bool(cases) and matched == len(cases), prompts=len(cases), matched=matched,
                        tokens_compared=sum(c.get("tokens", 0) for c in cases if c["ok"]),
                        cases=[GoldenCase.model_validate(c) for c in cases])
