"""Which per-request samples of a bench report a latency check reads, and the recorded baseline a
promote keeps (`baseline`). The checks themselves are in validation/judge.py, the statistics in
validation/stats.py. Reports without samples (older JSON, or ITL read from a server histogram) are
judged on the point estimate, and the check says so.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from validation.reports.bench import BenchReport, Samples


def _nums(v: Any) -> list[float] | None:
    """A list of finite numbers, else None (a report of another shape is judged without samples)."""
    if not isinstance(v, list) or not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) for x in v):
        return None
    return v


def _samples(b: BenchReport) -> Samples:
    return b.samples if b.samples is not None else Samples()


def quantile_samples(b: BenchReport, metric: str, itl_src: str) -> tuple[list[float], list[int] | None] | str:
    """The samples a quantile threshold is judged on, or why there are none."""
    s = _samples(b)
    if metric == "itl_ms" and b.itl_level == "chunk":
        if itl_src.startswith("server"):
            return "the server's ITL histogram holds no per-request samples"
        metric = "tpot_ms"
    key = metric[:-3]
    vals = _nums(getattr(s, key))
    if not vals:
        return "no per-request samples in the bench report"
    if key == "itl":
        counts = _nums(s.itl_counts)
        if not counts or any(c < 0 or c != int(c) for c in counts) or sum(counts) != len(vals):
            return "ITL gaps without their per-request counts (a report from before itl_counts)"
        return vals, [int(c) for c in counts]
    return vals, None


def request_samples(b: BenchReport, metric: str, chunk: bool = False) -> list[float] | str:
    """One value per request for a rank test: TTFT, TPOT, or each request's mean ITL gap (the gaps
    of one request are not independent draws). Chunk-level ITL uses TPOT (per token); `chunk`: the
    other side of the comparison is chunk-level, so both sides use TPOT."""
    s = _samples(b)
    if metric == "itl_ms" and b.itl_level != "chunk" and not chunk:
        means = _nums(s.itl_means)
        if means:     # a baseline (see `baseline`)
            return means
        vals, counts = _nums(s.itl), _nums(s.itl_counts)
        if not vals or not counts or any(c < 0 or c != int(c) for c in counts) or sum(counts) != len(vals):
            return "no per-request ITL samples with counts"
        arr, out, i = np.asarray(vals, dtype=float), [], 0
        for c in map(int, counts):
            if c:
                out.append(float(arr[i:i + c].mean()))
            i += c
        return out or "no request with ITL gaps"
    key = "tpot" if metric == "itl_ms" else metric[:-3]
    got = _nums(getattr(s, key))
    if got is None or min(got) <= 0:
        return f"no per-request {key} samples"
    return got


# A promote records its benches as the baseline later vs_stable checks compare with; the Kubernetes
# target keeps baselines in its history ConfigMap (1 MiB for 20 records with their manifests), so a
# baseline keeps only what the checks read, at most this many requests per load (a seeded subset of
# whole requests, each with its block), 0.01 ms: ~5 KB per metric and load.
BASELINE_REQUESTS = 300


def baseline(bench: BenchReport | dict[str, Any]) -> dict[str, Any]:
    """A bench as a baseline (its JSON): ttft, tpot and each request's mean ITL gap (`itl_means`),
    ITL gaps dropped. With blocks (`samples.block`), one subset of requests is kept for every metric so
    each value keeps its block (validation/judge.py pairs blocks)."""
    import random

    b = BenchReport.coerce(bench)
    data = b.json_data()
    if b.samples is None:
        return data
    means = request_samples(b, "itl_ms")
    out: dict[str, list[Any]] = {"ttft": _nums(b.samples.ttft) or [], "tpot": _nums(b.samples.tpot) or [],
                                 "itl_means": means if isinstance(means, list) else []}
    block = b.samples.block
    if block is not None and all(len(v) == len(block) for v in out.values()):
        keep = sorted(random.Random(0).sample(range(len(block)), min(len(block), BASELINE_REQUESTS)))
        out = {k: [round(v[i], 2) for i in keep] for k, v in out.items()}
        return {**data, "samples": {**out, "block": [block[i] for i in keep]}}
    for k, v in out.items():
        if len(v) > BASELINE_REQUESTS:
            v = random.Random(0).sample(v, BASELINE_REQUESTS)
        out[k] = [round(x, 2) for x in v]
    return {**data, "samples": out}
