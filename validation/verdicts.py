"""Latency checks that say how sure they are: pass (proven within the limit), fail (proven beyond
it) or inconclusive, with the interval and the smallest effect the run could detect.

Called by validation.gate.decide for each SLO quantile threshold and each vs_stable factor when the
bench reports carry per-request samples (validation.metrics.samples); reports without them (older
JSON, or ITL read from a server histogram) are judged on the point estimate as before, and the
check says so. The statistics themselves are in validation/stats.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from validation import stats
from validation.config import Statistics
from validation.reports.bench import BenchReport, Samples


@dataclass
class Judged:
    verdict: str                      # pass | fail | inconclusive
    ok: bool                          # what the gate does with it (policy applied)
    message: str
    interval: tuple[float, float] | None
    confidence: float
    detectable: dict[str, float]


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
# baseline keeps only what the rank tests read, at most this many requests per load (a seeded subset:
# 300 of prod's 500 widens the shift interval by 15%), 0.01 ms: ~5 KB per metric and load.
BASELINE_REQUESTS = 300


def baseline(bench: BenchReport | dict[str, Any]) -> dict[str, Any]:
    """A bench as a baseline (its JSON): ttft, tpot and each request's mean ITL gap (`itl_means`),
    ITL gaps dropped."""
    import random

    b = BenchReport.coerce(bench)
    data = b.json_data()
    if b.samples is None:
        return data
    means = request_samples(b, "itl_ms")
    out = {"ttft": _nums(b.samples.ttft) or [], "tpot": _nums(b.samples.tpot) or [],
           "itl_means": means if isinstance(means, list) else []}
    for k, v in out.items():
        if len(v) > BASELINE_REQUESTS:
            v = random.Random(0).sample(v, BASELINE_REQUESTS)
        out[k] = [round(x, 2) for x in v]
    return {**data, "samples": out}


def _policy(verdict: str, point_ok: bool, st: Statistics, look: int) -> tuple[bool, str]:
    if verdict != "inconclusive":
        return verdict == "pass", ""
    if st.inconclusive == "point_estimate":
        return point_ok, f"; inconclusive, decided by the point estimate ({'within' if point_ok else 'beyond'} " \
                         "the limit; slo.statistics.inconclusive: point_estimate)"
    if st.inconclusive == "extend" and look < st.max_looks:
        return False, f"; look {look} of {st.max_looks}: more requests needed"
    return False, "; not proven within the limit, so it fails" + (
        f" (look {look} of {st.max_looks}, the cap)" if st.inconclusive == "extend" else
        " (slo.statistics.inconclusive: fail)")


def threshold(vals: list[float], clusters: list[int] | None, q: float, limit: float, st: Statistics,
              look: int) -> Judged:
    conf = 1 - (1 - st.confidence) / (st.max_looks if st.inconclusive == "extend" else 1)
    ci = stats.quantile_ci(vals, q, conf, clusters)
    verdict = "pass" if ci.upper <= limit else "fail" if ci.lower > limit else "inconclusive"
    ok, note = _policy(verdict, ci.estimate <= limit, st, look)
    up = math.inf if ci.estimate <= 0 else ci.upper / ci.estimate - 1
    down = 1 - ci.lower / ci.estimate if ci.estimate > 0 and ci.lower > -math.inf else math.inf
    need = ("" if math.isfinite(ci.upper) else
            f"; {ci.n} samples cannot bound a p{round(q * 100)} from above at {conf:.1%}: needs "
            f"{math.ceil(math.log(1 - conf) / math.log(q))} (order statistics)")
    msg = (f"bounds [{_v(ci.lower)}, {_v(ci.upper)}] ms at {conf:.1%} ({ci.method}, n={ci.n}): {verdict}{note}; "
           f"resolution +{_pct(up)}/-{_pct(down)}{need}")
    return Judged(verdict, ok, msg, (ci.lower, ci.upper), conf, {"above": up, "below": down})


def vs_stable(cand: list[float], stable: list[float], factor: float, st: Statistics, look: int,
              comparisons: int) -> Judged:
    k = (st.max_looks if st.inconclusive == "extend" else 1) * max(1, comparisons)
    conf = 1 - (1 - st.confidence) / k
    r = stats.shift_ratio(cand, stable, conf)
    mw = stats.mann_whitney(cand, stable)
    verdict = "pass" if r.upper <= factor else "fail" if r.lower > factor else "inconclusive"
    ok, note = _policy(verdict, r.estimate <= factor, st, look)
    zz = stats.z_of(conf) + stats.z_of(st.power)
    # the interval's width gives the standard error of the log shift (too few samples: no bounds)
    bounded = r.lower > 0 and math.isfinite(r.upper)
    se = (math.log(r.upper) - math.log(r.lower)) / (2 * stats.z_of(conf)) if bounded else math.inf
    mde = math.exp(zz * se) - 1 if math.isfinite(se) else math.inf
    fails = factor * math.exp(zz * se) - 1 if math.isfinite(se) else math.inf
    msg = (f"shift {r.estimate:.3f}x stable, bounds [{r.lower:.3f}, {r.upper:.3f}] at {conf:.1%} "
           f"(Hodges-Lehmann, Mann-Whitney p={mw.p_greater:.3g} one-sided, n={len(cand)}/{len(stable)}) "
           f"vs limit {factor}x: {verdict}{note}; smallest detectable regression +{_pct(mde)} "
           f"(power {st.power:.0%}); fails with that power from +{_pct(fails)}")
    return Judged(verdict, ok, msg, (r.lower, r.upper), conf,
                  {"smallest_regression": mde, "fails_from": fails, "p_value": mw.p_greater,
                   "ratio": r.estimate, "bonferroni": k})


def _v(v: float) -> str:
    return f"{v:.1f}" if math.isfinite(v) else ("-inf" if v < 0 else "inf")


def _pct(v: float) -> str:
    return "inf" if not math.isfinite(v) else f"{v:.1%}"
