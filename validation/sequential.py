"""Sequences of runs: extending an inconclusive run (slo.statistics.inconclusive: extend: the same
load again, merged), and the scheduled canary as a sequential test across runs (`canary_decision`).

The correction for repeated looks is in the levels each look is judged at (validation/judge.py
budget: both error rates split over the planned looks), so any number of looks up to max_looks keeps
them. Looks are planned, not open-ended: the last one's inconclusive checks fail.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from validation import metrics
from validation.reports.bench import BenchReport, KvEvidence, Quantiles, Samples


def _add(x: float | None, y: float | None) -> float | None:
    """A sum of two runs' figures; null when either run lacks it (a half-known total is not a total)."""
    return None if x is None or y is None else x + y


def _both(x: list[Any] | None, y: list[Any] | None) -> list[Any] | None:
    return x + y if x is not None and y is not None else None


def _look(b: BenchReport) -> dict[str, object]:
    return {"requests_ok": b.requests_ok, **{k: (getattr(b, k) or Quantiles()).model_dump(mode="json")
                                             for k in ("ttft_ms", "tpot_ms", "itl_ms")}}


def merge_bench(a: BenchReport, b: BenchReport) -> BenchReport:
    """Two runs of one load as one report: counts summed, samples concatenated, latency summaries
    recomputed from the merged samples; server evidence summed (KV tokens, NIXL failures) when both runs have it, else
    the latest run's (missing evidence stays missing); the latest run's histograms kept. `looks` lists
    each run's own summary."""
    sa, sb = a.samples or Samples(), b.samples or Samples()
    samples = Samples(ttft=(sa.ttft or []) + (sb.ttft or []), tpot=(sa.tpot or []) + (sb.tpot or []),
                      itl=(sa.itl or []) + (sb.itl or []), itl_counts=(sa.itl_counts or []) + (sb.itl_counts or []),
                      # per-request outcomes only when both runs have them (else the summed counts are the truth)
                      outcomes=sa.outcomes + sb.outcomes if sa.outcomes is not None and sb.outcomes is not None
                      else None,
                      # block ids (the gate's pairs, validation/judge.py) only when both runs have them
                      block=_both(sa.block, sb.block),
                      outcome_block=_both(sa.outcome_block, sb.outcome_block),
                      tpot_block=_both(sa.tpot_block, sb.tpot_block),
                      itl_means=_both(sa.itl_means, sb.itl_means))
    out = b.model_copy(deep=True)
    out.samples = samples
    total, errors = _add(a.requests_total, b.requests_total), _add(a.errors, b.errors)
    good, wall = _add(a.goodput_requests, b.goodput_requests), _add(a.wall_s, b.wall_s)
    out.requests_total = None if total is None else int(total)
    out.requests_ok = None if (ok := _add(a.requests_ok, b.requests_ok)) is None else int(ok)
    out.errors = None if errors is None else int(errors)
    out.goodput_requests = None if good is None else int(good)
    out.wall_s = wall
    out.error_rate = errors / total if errors is not None and total else None
    out.goodput_rps = good / wall if good is not None and wall else None
    out.slo_attainment = good / total if good is not None and total else None
    for m in ("ttft", "tpot", "itl"):
        setattr(out, f"{m}_ms", Quantiles.model_validate(metrics.summary(getattr(samples, m) or [])))
    ha, hb = a.client_health, b.client_health
    out.client_health = hb.model_copy(update={"client_bottleneck": ha.client_bottleneck or hb.client_bottleneck,
                                              "reasons": ha.reasons + hb.reasons})
    out.void_attempts = a.void_attempts + b.void_attempts
    ka = a.server.kv if a.server is not None else None
    kb = b.server.kv if b.server is not None else None
    if ka is not None and kb is not None and out.server is not None:
        out.server.kv = KvEvidence.model_validate({
            **kb.model_dump(),
            "external_kv_prompt_tokens": _add(ka.external_kv_prompt_tokens, kb.external_kv_prompt_tokens),
            "nixl_failed_transfers": _add(ka.nixl_failed_transfers, kb.nixl_failed_transfers)})
    if a.tpot_unmeasured is not None and b.tpot_unmeasured is not None:
        out.tpot_unmeasured = {k: a.tpot_unmeasured.get(k, 0) + b.tpot_unmeasured.get(k, 0)
                               for k in sorted({*a.tpot_unmeasured, *b.tpot_unmeasured})}
    else:
        out.tpot_unmeasured = None
    out.looks = (a.looks or [_look(a)]) + [_look(b)]
    recomputed = ("requests_total", "requests_ok", "errors", "goodput_requests", "wall_s", "error_rate", "goodput_rps",
                  "slo_attainment", "ttft_ms", "tpot_ms", "itl_ms", "server.kv")
    out.missing = {k: v for k, v in b.missing.items() if k not in recomputed}
    return BenchReport.model_validate(out.model_dump())   # reasons for what the merge could not know


# ---- the scheduled canary as a sequential test across runs -----------------------------------------------
# pd-canary re-validates the stable release every 30 minutes (48 runs a day). Judging each run on its own
# at 95 % raises a false alarm every ~20 runs: daily. Instead each run contributes one figure (its log
# latency ratio against the release's baseline, standardized), and a one-sided CUSUM (Page 1954)
# accumulates evidence of a sustained slowdown across runs: S_t = max(0, S_{t-1} + z_t - k), alarm when
# S_t > h. The false-alarm rate per 30 days is measured by scripts/bench_gate_sim.py (docs/gate.md
# "Error rates"); Siegmund's approximation of the in-control run length, (e^{2k(h+1.166)} - 2k(h+1.166)
# - 1) / (2k^2), gives about 2,570 runs at k = 0.5, h = 6: 0.56 false alarms in 1,440 runs.


@dataclass(frozen=True)
class RunStat:
    """One canary run: log(stable's quantile now / its baseline's), and that figure's standard error."""

    log_ratio: float
    se: float | None = None
    at: float | None = None        # unix time of the run (reports only)


@dataclass(frozen=True)
class CanaryConfig:
    k: float = 0.5                 # reference value: half the sustained shift to catch, in standard deviations
    h: float = 6.0                 # decision interval
    sigma: float | None = None     # run-to-run sd of log_ratio; None: estimated from the history (MAD)
    min_history: int = 8           # runs needed before sigma can be estimated from the history


@dataclass(frozen=True)
class CanaryDecision:
    alarm: bool
    statistic: float               # the CUSUM after the latest run
    h: float
    runs: int
    sigma: float | None
    message: str


def _sigma(history: Sequence[RunStat], cfg: CanaryConfig) -> float | None:
    if cfg.sigma is not None:
        return cfg.sigma
    x = np.asarray([r.log_ratio for r in history], dtype=float)
    own = float(np.median([r.se or 0.0 for r in history])) if history else 0.0   # a typical run's own SE
    if len(x) < cfg.min_history:
        return own or None
    mad = 1.4826 * float(np.median(np.abs(x - np.median(x))))
    return max(mad, own) or None


def cusum(z: Sequence[float], k: float, h: float) -> tuple[list[float], list[int]]:
    """One-sided upper CUSUM of standardized figures, restarting at 0 after each alarm: (path, alarms)."""
    s, path, alarms = 0.0, [], []  # type: tuple[float, list[float], list[int]]
    for i, v in enumerate(z):
        s = max(0.0, s + v - k)
        path.append(s)
        if s > h:
            alarms.append(i)
            s = 0.0
    return path, alarms


def canary_decision(history: Sequence[RunStat], cfg: CanaryConfig = CanaryConfig()) -> CanaryDecision:
    """Alarm or not after the latest run of `history` (oldest first), with the CUSUM statistic. A history
    whose spread cannot be known yet (fewer than min_history runs and no standard errors) raises no alarm
    and says so: the canary's single-run checks still stand."""
    if not history:
        return CanaryDecision(False, 0.0, cfg.h, 0, None, "no canary run yet")
    sigma = _sigma(history, cfg)
    if not sigma:
        return CanaryDecision(False, 0.0, cfg.h, len(history), None,
                              f"{len(history)} runs without standard errors: the run-to-run spread is not known "
                              f"before {cfg.min_history} runs (CUSUM not started)")
    path, alarms = cusum([r.log_ratio / sigma for r in history], cfg.k, cfg.h)
    last = len(history) - 1
    alarm = bool(alarms) and alarms[-1] == last
    stat = cfg.h + 1e-9 if alarm else path[-1]
    ratio = math.exp(history[-1].log_ratio)
    return CanaryDecision(alarm, path[-1], cfg.h, len(history), sigma,
                          f"canary CUSUM {stat:.2f} {'>' if alarm else '<='} h {cfg.h} after {len(history)} runs "
                          f"(latest {ratio:.3f}x baseline, run-to-run sd {sigma:.3f} of log ratio, k {cfg.k}): "
                          + ("sustained slowdown: alarm" if alarm else "no alarm"))
