"""Stopping a load's measurement early on a failure beyond doubt (slo.statistics.stop_early).

A candidate that is already certainly failing an absolute SLO (a regressed engine, twice the ITL
limit) used to be measured to the end of every load before the gate rolled it back: GPU time and
release time spent on a decided question. Interim looks settle it while the load runs:

- **When.** At judge.INTERIM_LOOKS (1/8, 1/4, 1/2) of a load's planned requests (a load measured
  alone: validation/loadgen.py calls the look as completed requests cross each point), or of its
  planned block pairs (a load interleaved with its baseline: validation/interleave.py, after the
  candidate's block). A look needs at least 2 blocks (or batches): no interval otherwise.
- **What.** The absolute SLO quantiles and a non-zero error tolerance only (judge.interim_planned),
  with the interval construction the final gate uses for that check: the share of samples above the
  limit with blocks (or, without blocks, consecutive batches, stats.batches) as clusters
  (stats.exceedance, judge.absolute), so the correlation of requests within a block is in it; errors
  by the exact Clopper-Pearson bound (validation/error_rates.py). Never vs_stable: a loss against
  the baseline is less certain than an SLO overrun (a paired comparison of a few blocks), and stays
  with the final gate.
- **How sure.** A check stops the run only when its one-sided lower bound at 1 - `interim_alpha` is
  beyond the limit: Haybittle-Peto's boundary (Haybittle 1971; Peto et al. 1976: interim p < 0.001, the
  final analysis at the nominal level), at min(0.001, its equal share of INTERIM_SHARE of the
  decision's false_rollback) (judge.Budget.interim_alpha), so the whole decision's false-rollback rate
  still holds by the union bound. Zero tolerance needs no test: one error fails it for certain.
- **Only failure stops.** No early promote: a clear pass still runs the whole plan (the gate's pass
  side, missed_regression and vs_stable, needs every request).
- **Biased the safe way.** A look in a closed loop sees the requests completed so far; the slow ones
  still in flight are missing, so its latency (and its timeouts, counted as errors) can only look
  better than the truth: the look is slower to stop, never quicker. The requests in flight count as
  successes among the outcomes (validation/bench.py `_look`): fast failures finish first and would
  otherwise be over-represented.

An early stop is recorded in the bench report (`stopped_early`), the gate fails the `stopped_early`
check with its words ("stopped early after N of M requests (block k of n): <check> ... at p < X"),
and the release's remaining loads are not measured (workflows/pipeline/steps.py CandidateLoads).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from validation import error_rates, judge, stats, verdicts
from validation.config import SLO
from validation.reports.bench import BenchReport, StoppedEarly


@dataclass(frozen=True)
class Beyond:
    """One check whose failure is beyond doubt at the interim level."""

    check: str
    text: str          # "<check> lower bound X > SLO Y"


# a look: the candidate's bench so far -> the checks beyond doubt (empty: go on)
Look = Callable[[BenchReport], list[Beyond]]


def points(total: int) -> list[int]:
    """The interim looks of a load of `total` requests (or block pairs): after this many, at
    judge.INTERIM_LOOKS, each at least 2 (an interval needs 2 blocks) and before the end."""
    return sorted({n for f in judge.INTERIM_LOOKS if (n := max(2, math.ceil(total * f))) < total})


def _values(b: BenchReport, metric: str) -> judge.Blocked | None:
    """The samples the final gate judges this absolute check on (validation/gate.py _latency_checks), or
    None when it judges no interval (a server histogram, too few TPOT timings, no samples)."""
    from validation.gate import itl_source

    _, src = itl_source(b) if metric == "itl_ms" else (None, "")
    got = verdicts.quantile_samples(b, metric, src)
    if isinstance(got, str):
        return None
    per = "ttft_ms" if metric == "ttft_ms" else "tpot_ms"
    if per == "tpot_ms" and got[1] is None and judge.tpot_coverage(b):
        return None
    values = judge.gap_values(b) if got[1] is not None else judge.request_values(b, per)
    return None if isinstance(values, str) else values


def _absolute(b: BenchReport, p: judge.Planned, level: float) -> Beyond | None:
    values = _values(b, str(p.metric))
    if values is None:
        return None
    vals, ids = values
    q, limit = float(p.q or 0), float(p.limit or 0)
    clusters = ids if ids is not None else np.asarray(stats.batches(len(vals)))
    ex = stats.exceedance(vals, clusters, limit, q)
    low, _ = ex.bounds(1 - level, 0.5)
    if not low > 1 - q:
        return None
    qlow, _ = stats.quantile_ci_blocks(vals, clusters, q).bounds(1 - level, 0.5)
    qn = f"p{stats.q_name(q)}"
    bound = (f"{qn} lower bound {qlow:.1f} ms > SLO {limit:g} ms" if math.isfinite(qlow) and qlow > limit else
             f"{qn} beyond SLO {limit:g} ms")
    return Beyond(p.check, f"{p.check} {bound} ({ex.above} of {ex.n} samples above it, share lower bound "
                           f"{low:.1%} > {1 - q:.0%} allowed)")


def _errors(b: BenchReport, tolerance: float, level: float) -> Beyond | None:
    k, n, _ = error_rates.counts(b)
    if n == 0 or k == 0:
        return None
    if tolerance == 0:
        return Beyond("error_rate", f"error_rate {k} error{'s' if k != 1 else ''} in {n} requests > "
                                    "max_error_rate 0 (zero tolerance: certain)")
    low = error_rates.lower_bound(k, n, 1 - level)
    if not low > tolerance:
        return None
    return Beyond("error_rate", f"error_rate lower bound {low:.2%} > max_error_rate {tolerance:.2%} ({k} errors in "
                                f"{n} requests, Clopper-Pearson)")


def look(b: BenchReport, slo: SLO, bud: judge.Budget) -> list[Beyond]:
    """The checks whose failure the candidate's bench so far puts beyond doubt at `bud.interim_alpha`."""
    level = bud.interim_alpha
    out: list[Beyond] = []
    for p in judge.interim_planned(slo) if level > 0 else []:
        got = _absolute(b, p, level) if p.kind == "absolute" else None
        out += [got] if got is not None else []
    tol = _errors(b, slo.max_error_rate, level) if level > 0 or slo.max_error_rate == 0 else None
    return out + ([tol] if tol is not None else [])


# stop(the candidate's bench so far, done, planned) -> an early stop, or None; done/planned are requests
# (a load measured alone, validation/bench.py) or block pairs (interleaved, validation/interleave.py)
Stop = Callable[[BenchReport, int, int], StoppedEarly | None]


@dataclass(frozen=True)
class Stops:
    """A load's interim looks: `alone` for a bench of the candidate alone, `blocks` between block pairs."""

    alone: Stop
    blocks: Stop


def stops(slo: SLO, loads: int, requests: int | None) -> Stops | None:
    """The interim looks of one load of a release of `loads` loads planning `requests` requests (per side);
    None with slo.statistics.stop_early off."""
    if not slo.statistics.stop_early:
        return None
    bud = judge.budget(slo, loads)

    def alone(b: BenchReport, done: int, planned: int) -> StoppedEarly | None:
        found = look(b, slo, bud)
        return stopped(found, bud.interim_alpha, done, planned) if found else None

    def blocks(b: BenchReport, done: int, planned: int) -> StoppedEarly | None:
        found = look(b, slo, bud)
        return stopped(found, bud.interim_alpha, b.requests_total or 0, requests or 0, done, planned) if found \
            else None
    return Stops(alone, blocks)


def stopped(found: list[Beyond], bud_level: float, after: int, planned: int, block: int | None = None,
            blocks: int | None = None) -> StoppedEarly:
    """The record of an early stop (BenchReport.stopped_early), with the words the gate reports."""
    where = f" (block {block} of {blocks})" if block is not None else ""
    first = found[0]
    of = f" of {planned}" if planned else ""     # a timed load (duration_s) plans no request count
    text = (f"stopped early after {after}{of} requests{where}: {first.text} at p < {bud_level:.2g}"
            + "".join(f"; {f.text}" for f in found[1:]))
    return StoppedEarly(after=after, planned=planned, block=block, blocks=blocks, checks=[f.check for f in found],
                        level=bud_level, reason=text)
