"""Latency metrics from parsed records (validation.loadgen.parse_record). All outputs in ms.

TTFT ends at the first non-empty content chunk. ITL = gaps between content chunks, pooled.
TPOT = (e2e - TTFT) / (output_tokens - 1) per request, output tokens from the server's usage.
Goodput (DistServe) = requests/s meeting the TTFT and TPOT SLOs together.
"""
from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterable
from typing import Any

PCTS = (50, 90, 95, 99)
# Above this many tokens per chunk on average the server batches its stream (Ray Serve does):
# client chunk gaps are then chunk-level, not inter-token latency.
CHUNK_LEVEL_TOKENS = 1.5


def percentile(sorted_vals: list[float], p: float) -> float:
    """The p-th percentile, p in [0, 100], by linear interpolation between closest ranks (numpy's
    default; validation/stats.py quantile takes q in [0, 1])."""
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(sorted_vals) - 1)
    return sorted_vals[f] + (sorted_vals[c] - sorted_vals[f]) * (k - f)


def summary(vals: Iterable[float]) -> dict:
    v = sorted(x for x in vals if x is not None and not math.isnan(x))
    if not v:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None}
    out = {"count": len(v), "mean": sum(v) / len(v)}
    for p in PCTS:
        out[f"p{p}"] = percentile(v, p)
    out["max"] = v[-1]
    return out


def output_tokens(rec: dict) -> int | None:
    u = rec.get("usage") or {}
    ct = u.get("completion_tokens")
    return ct if isinstance(ct, int) else None


def decode_timing(rec: dict, ntok: int | None) -> str | None:
    """Why this request's TPOT cannot be measured at the client (BenchReport.tpot_unmeasured counts the
    reasons: one_token, no_usage, one_read, decode_not_timed), or None when it can.

    TPOT is (e2e - TTFT) / (tokens - 1): it times decode only when the client saw decode happen, i.e.
    when the content events after the first arrived spread over later socket reads. The real local A/A
    (docs/measurements.md, 2026-12-05 second batch) kept TPOT samples of 0.01-0.05 ms: 128-token streams
    that reached the client in one read after a client stall, the few ms to the final usage chunk divided
    by 127. One such baseline sample moved its block pair's ratio about 80x and rolled back an identical
    release. Half, not all: Ray Serve batches its stream, so several events share a read in a healthy
    run (tokens_per_chunk 1.5-4 on the local stack); a stream whose later half came in one read after a
    stall is dominated by that stall, not by decode."""
    if ntok is None:
        return "no_usage"
    if ntok <= 1:
        return "one_token"
    first, later = rec.get("first_content"), (rec.get("chunk_times") or [])[1:]
    in_later_reads = sum(1 for t in later if first is not None and t > first)
    if in_later_reads == 0:
        return "one_read"
    if in_later_reads * 2 < len(later):
        return "decode_not_timed"
    return None


def per_request(rec: dict, from_scheduled: bool = False) -> dict:
    """Timings (ms) of one successful record; origin is actual send (or scheduled send)."""
    origin = rec["scheduled"] if (from_scheduled and rec.get("scheduled") is not None) else rec["sent"]
    ttft = (rec["first_content"] - origin) * 1000 if rec.get("first_content") is not None else None
    end = rec.get("last_chunk") or rec.get("done")
    e2e = (end - origin) * 1000 if end is not None else None
    ntok = output_tokens(rec)
    # not measured is null with its reason (decode_timing), never a 0 ms or 0.03 ms TPOT
    untimed = decode_timing(rec, ntok)
    if untimed is None and (ttft is None or e2e is None or e2e <= ttft):
        untimed = "one_read"    # no time between the first content and the end: nothing timed
    tpot = (e2e - ttft) / (ntok - 1) if untimed is None and ntok and ttft is not None and e2e is not None else None
    ct = rec.get("chunk_times") or []
    itl = [(b - a) * 1000 for a, b in itertools.pairwise(ct)]
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot, "tpot_unmeasured": untimed, "itl": itl, "tokens": ntok,
            "chunks": len(ct)}


def itl_level(tokens_per_chunk_mean: float | None) -> str:
    """"chunk" when the client's gaps span several tokens each, else "token"."""
    return "chunk" if tokens_per_chunk_mean is not None and tokens_per_chunk_mean > CHUNK_LEVEL_TOKENS else "token"


def is_ok(rec: dict) -> bool:
    return rec.get("error") is None and rec.get("status") == 200 and rec.get("first_content") is not None


def _goodput(requests: list[dict], ttft_ms: float | None, tpot_ms: float | None) -> int:
    """Requests meeting both SLOs together (a missing SLO counts as met); open loop measures them
    from the scheduled origin (the caller's per_request(from_scheduled=True))."""
    good = 0
    for p in requests:
        t_ok = ttft_ms is None or (p["ttft"] is not None and p["ttft"] <= ttft_ms)
        # a 1-token response has no TPOT: it meets the TPOT SLO vacuously
        d_ok = tpot_ms is None or p["tpot"] is None or p["tpot"] <= tpot_ms
        good += t_ok and d_ok
    return good


def compute(records: list[dict], wall_s: float, goodput_ttft_ms: float | None = None,
            goodput_tpot_ms: float | None = None, open_loop: bool = False) -> dict:
    recs = [r for r in records if not r.get("warmup")]
    ok = [r for r in recs if is_ok(r)]
    errs = [r for r in recs if not is_ok(r)]
    pr = [per_request(r) for r in ok]
    itl = [g for p in pr for g in p["itl"]]
    tokens = [p["tokens"] for p in pr if p["tokens"] is not None]
    prompts = [int(r["usage"]["prompt_tokens"]) for r in ok
               if isinstance(r.get("usage"), dict) and isinstance(r["usage"].get("prompt_tokens"), int)]
    tok_per_chunk = [p["tokens"] / p["chunks"] for p in pr if p["tokens"] and p["chunks"]]
    # Not measured is null with a reason (docs/reports.md), never 0: a run of no requests has no
    # error rate, and one of no wall time no throughput.
    rate = (lambda n: n / wall_s) if wall_s > 0 else (lambda n: None)
    missing: dict[str, str] = {}
    if not recs:
        missing.update(error_rate="no request was measured", slo_attainment="no request was measured")
    if wall_s <= 0:
        for k in ("request_throughput_rps", "output_token_throughput_tps", "input_token_throughput_tps", "goodput_rps"):
            missing[k] = "the run took no measurable wall time"
    out = {
        "requests_total": len(recs),
        "requests_ok": len(ok),
        "errors": len(errs),
        "error_rate": (len(errs) / len(recs)) if recs else None,
        "error_samples": sorted({(r.get("error") or f"status {r.get('status')}")[:200] for r in errs})[:5],
        "wall_s": wall_s,
        "ttft_ms": summary(p["ttft"] for p in pr),
        "itl_ms": summary(itl),
        "tpot_ms": summary(p["tpot"] for p in pr),
        # successful requests without a TPOT, by reason (decode_timing): the gate refuses to judge TPOT
        # on a side that timed too few of its multi-token requests (validation/gate.py tpot_coverage)
        "tpot_unmeasured": dict(sorted(collections.Counter(
            p["tpot_unmeasured"] for p in pr if p["tpot_unmeasured"] is not None).items())),
        "e2e_ms": summary(p["e2e"] for p in pr),
        "tokens_per_chunk": summary(tok_per_chunk),
        "itl_level": itl_level(summary(tok_per_chunk)["mean"]),
        "output_tokens": summary(tokens),
        "requests_missing_usage": sum(1 for p in pr if p["tokens"] is None),
        "request_throughput_rps": rate(len(ok)),
        "output_token_throughput_tps": rate(sum(tokens)),
        # Prompt tokens as the server counted them (usage), for the cost per million input tokens.
        "input_tokens": summary(prompts),
        "input_token_throughput_tps": rate(sum(prompts)),
    }
    if open_loop:
        prs = [per_request(r, from_scheduled=True) for r in ok]
        out["ttft_from_scheduled_ms"] = summary(p["ttft"] for p in prs)
        out["e2e_from_scheduled_ms"] = summary(p["e2e"] for p in prs)
    good = _goodput([per_request(r, from_scheduled=open_loop) for r in ok], goodput_ttft_ms, goodput_tpot_ms)
    out["goodput_requests"] = good
    out["goodput_rps"] = rate(good)
    out["slo_attainment"] = good / len(recs) if recs else None
    out["goodput_slo"] = {"ttft_ms": goodput_ttft_ms, "tpot_ms": goodput_tpot_ms}
    for k, v in out.items():
        if isinstance(v, dict) and v.get("count") == 0:
            missing[k] = ("no successful request" if not ok else "no successful request carried it"
                          + (" (no usage in the answers)" if k in ("output_tokens", "input_tokens") else ""))
    out["missing"] = missing
    return out


# Per-request samples kept in the bench JSON for the gate's intervals and rank tests (validation/stats.py)
# and for plots. Bounded so a long run cannot bloat a report: at most this many requests (TTFT, TPOT)
# and ITL gaps; above it a seeded random subset of whole requests is kept and `truncated` says so.
# 20,000 requests is 40x the largest overlay's 500; 200,000 gaps is 500 requests of 400 tokens.
MAX_SAMPLE_REQUESTS = 20_000
MAX_ITL_SAMPLES = 200_000


def samples(records: list[dict]) -> dict:
    """Per-request samples (ms, 3 decimals): ttft and tpot one per request, itl the gaps of each
    request in order with `itl_counts` gaps per request (the gate treats requests as clusters)."""
    import random

    pr = [per_request(r) for r in records if not r.get("warmup") and is_ok(r)]
    n_all, gaps_all = len(pr), sum(len(p["itl"]) for p in pr)
    if n_all > MAX_SAMPLE_REQUESTS or gaps_all > MAX_ITL_SAMPLES:
        rng = random.Random(0)
        order = rng.sample(range(n_all), n_all)
        keep: list[int] = []
        gaps = 0
        for i in order:
            if len(keep) >= MAX_SAMPLE_REQUESTS or gaps + len(pr[i]["itl"]) > MAX_ITL_SAMPLES:
                break
            keep.append(i)
            gaps += len(pr[i]["itl"])
        pr = [pr[i] for i in sorted(keep)]
    r3 = lambda v: round(v, 3)  # noqa: E731
    out: dict[str, Any] = {"ttft": [r3(p["ttft"]) for p in pr if p["ttft"] is not None],
           "tpot": [r3(p["tpot"]) for p in pr if p["tpot"] is not None],
           "itl": [r3(g) for p in pr for g in p["itl"]],
           "itl_counts": [len(p["itl"]) for p in pr],
           # every measured request (never truncated), send order: the gate counts errors from these
           "outcomes": [int(is_ok(r)) for r in sorted((r for r in records if not r.get("warmup")),
                                                      key=lambda r: r.get("sent") or 0.0)]}
    if len(pr) < n_all:
        out["truncated"] = {"requests_kept": len(pr), "requests": n_all, "itl_gaps": gaps_all}
    return out
