"""The judge: what each latency check concludes from the samples, with the error rates it keeps.

Pure functions of samples (no I/O); validation/gate.py `decide` calls them for every check, and
`pdops plan-load` (validation/plan.py) and the simulator (scripts/bench_gate_sim.py) use the same
`planned_checks` and `budget`, so the plan, the gate and the calibration count the same comparisons.

Every check has a limit (a vs_stable factor, an SLO in ms) and its share `alpha` of the decision's
false-rollback budget: slo.statistics.false_rollback split over every planned check of every load and
look (Bonferroni), because ANY failing check rolls the release back: the correction belongs on the
rollback side (issue 21: the old gate applied it to the pass side, which made unchanged candidates
fail more often and bounded nothing). beta = slo.statistics.missed_regression / looks.

- vs_stable (`vs_baseline`): fail when proven slower than the baseline (the ratio's lower bound at
  1 - alpha above 1) and the estimate is beyond the factor: an unchanged candidate is rolled back at
  most alpha of the time, whatever the run's size, so the whole decision's false-rollback rate is at
  most false_rollback. How large a regression is caught depends on the run's size: each check states
  the ratio it rolls back with 1 - beta, `pdops plan-load` sizes the runs for the regression to catch,
  and a run too small to catch factor^3 is inconclusive (it could promote a real regression).
- absolute SLO quantile (`absolute`): pass when the upper bound at 1 - beta is within the limit (a
  candidate truly beyond it is promoted at most beta of the time), fail when the lower bound at
  1 - alpha is beyond it, else inconclusive.
- inconclusive: `slo.statistics.inconclusive` decides (fail by default: not promoted). A run with
  fewer than 2 block pairs has no block-level variance and so no interval: inconclusive.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from validation import stats
from validation.config import SLO, Statistics
from validation.reports.bench import BenchReport, Samples

Kind = Literal["absolute", "vs_stable", "errors"]
# (check name, metric, quantile) of the absolute SLO thresholds; their limits are in slo.prefill / slo.decode
ABSOLUTE = (("ttft_p90_ms", "ttft_ms", 0.9), ("ttft_p99_ms", "ttft_ms", 0.99), ("itl_p90_ms", "itl_ms", 0.9),
            ("itl_p99_ms", "itl_ms", 0.99), ("tpot_p90_ms", "tpot_ms", 0.9), ("tpot_p99_ms", "tpot_ms", 0.99))
# slo.vs_stable fields: each compares the named quantile of one metric with the baseline's
VS = (("ttft_p90", "ttft_ms", 0.9), ("tpot_p90", "tpot_ms", 0.9), ("itl_p90", "itl_ms", 0.9),
      ("ttft_p99", "ttft_ms", 0.99), ("tpot_p99", "tpot_ms", 0.99), ("itl_p99", "itl_ms", 0.99))


@dataclass(frozen=True)
class Planned:
    """One comparison the gate makes for every load."""

    check: str                 # the Check's name in the decision
    kind: Kind
    metric: str | None = None
    q: float | None = None
    limit: float | None = None


def planned_checks(slo: SLO) -> list[Planned]:
    """Exactly the comparisons that can roll a load back on a statistical test: absolute SLO quantiles,
    vs_stable quantile ratios, the error tolerance (when not zero: zero tolerance is no test) and,
    with vs_stable, the errors against the baseline."""
    out: list[Planned] = []
    for name, metric, q in ABSOLUTE:
        limit = getattr(slo.prefill if metric == "ttft_ms" else slo.decode, name)
        if limit is not None:
            out.append(Planned(name, "absolute", metric, q, limit))
    vs = slo.vs_stable
    if vs is not None:
        out += [Planned(f"vs_stable_{name}", "vs_stable", metric, q, getattr(vs, name))
                for name, metric, q in VS if getattr(vs, name) is not None]
    if slo.max_error_rate > 0:
        out.append(Planned("error_rate", "errors", limit=slo.max_error_rate))
    if vs is not None:
        out.append(Planned("errors_vs_baseline", "errors"))
    return out


# Interim looks (slo.statistics.stop_early; validation/interim.py): at these fractions of each load's
# planned requests (or blocks), the absolute SLO checks and the error tolerance may stop the
# measurement on a failure beyond doubt. A group-sequential design with few looks (Pocock 1977,
# O'Brien & Fleming 1979 use 2-5); the boundary is Haybittle-Peto's (Haybittle 1971, Peto et al.
# 1976): a fixed, very strict interim level, the final analysis at the nominal level.
INTERIM_LOOKS = (1 / 8, 1 / 4, 1 / 2)
# The share of false_rollback the interim looks spend. Haybittle-Peto leave the final level unadjusted
# because interim tests at p < 0.001 add next to nothing to a 0.05 test; here each check's own level is
# far below 0.05 (prod: 0.15 %), so the addition is accounted for instead of assumed: the interim tests
# get this share, split equally over every one of them (Bonferroni: conservative, since successive looks
# at growing data are positively correlated), and the final checks keep the rest (their level moves by
# this share, 1 %). Union bound: P(any false rollback) <= interim share + final share = false_rollback.
INTERIM_SHARE = 0.01
HAYBITTLE_PETO = 0.001    # the interim level is never looser than Haybittle-Peto's p < 0.001


@dataclass(frozen=True)
class Budget:
    """The error rates of one decision: `alpha` per check (the false-rollback share), `beta` per look;
    with interim looks (slo.statistics.stop_early), `interim_alpha` per interim test."""

    false_rollback: float
    missed_regression: float
    checks: int               # planned checks x loads
    looks: int
    interim_checks: int = 0   # checks x loads that take interim looks (0: no interim looks)
    interim_looks: int = 0    # interim looks per load and look

    @property
    def interim_tests(self) -> int:
        return self.interim_checks * self.interim_looks * self.looks

    @property
    def final_share(self) -> float:
        """The part of false_rollback the final checks spend (all of it without interim looks)."""
        return self.false_rollback * (1 - INTERIM_SHARE if self.interim_tests else 1.0)

    @property
    def alpha(self) -> float:
        return self.final_share / (max(1, self.checks) * self.looks)

    @property
    def interim_alpha(self) -> float:
        """The one-sided level of each interim test: INTERIM_SHARE of false_rollback over every interim test
        of the decision, never above Haybittle-Peto's 0.001; 0 without interim looks."""
        if not self.interim_tests:
            return 0.0
        return min(HAYBITTLE_PETO, self.false_rollback * INTERIM_SHARE / self.interim_tests)

    @property
    def beta(self) -> float:
        return self.missed_regression / self.looks

    def text(self) -> str:
        return (f"share {self.alpha:.3%} of the decision's {self.false_rollback:.0%} false-rollback budget "
                f"({self.checks} checks" + (f" x {self.looks} looks" if self.looks > 1 else "") + ")"
                + (f"; {INTERIM_SHARE:.0%} of it spent on {self.interim_tests} interim tests at p < "
                   f"{self.interim_alpha:.2g} each" if self.interim_tests else ""))


def interim_planned(slo: SLO) -> list[Planned]:
    """The checks that take interim looks: the absolute SLO quantiles and a non-zero error tolerance
    (zero tolerance needs no test: one error fails it for certain). Never vs_stable or the errors against
    the baseline: a loss against the baseline is less certain than an SLO overrun."""
    return [p for p in planned_checks(slo) if p.kind == "absolute" or p.check == "error_rate"]


def budget(slo: SLO, loads: int) -> Budget:
    """Bonferroni on the rollback side: false_rollback over every planned check of every load and look,
    less the interim looks' share when the measurement may stop early (INTERIM_SHARE)."""
    st = slo.statistics
    looks = st.max_looks if st.inconclusive == "extend" else 1
    interim = len(interim_planned(slo)) * max(1, loads) if st.stop_early else 0
    return Budget(st.false_rollback, st.missed_regression, len(planned_checks(slo)) * max(1, loads), looks,
                  interim, len(INTERIM_LOOKS) if interim else 0)


@dataclass
class Judged:
    verdict: str                      # pass | fail | inconclusive
    ok: bool                          # what the gate does with it (policy applied)
    message: str
    interval: tuple[float, float] | None    # (lower at 1 - alpha, upper at 1 - beta)
    confidence: float                 # 1 - beta: the pass side's
    detectable: dict[str, float] = field(default_factory=dict)
    alpha: float | None = None        # the false-rollback budget share this check spent


def policy(verdict: str, point_ok: bool, st: Statistics, look: int) -> tuple[bool, str]:
    """What the gate does with a verdict (slo.statistics.inconclusive), and the words that say so."""
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


def _verdict(lower: float, upper: float, limit: float) -> str:
    return "pass" if upper <= limit else "fail" if lower > limit else "inconclusive"


def _f(v: float, unit: str = "") -> str:
    return f"{v:.3f}{unit}" if math.isfinite(v) and unit == "x" else f"{v:.1f}{unit}" if math.isfinite(v) else (
        "-inf" if v < 0 else "inf")


def _pct(v: float) -> str:
    return "inf" if not math.isfinite(v) else f"{v:.1%}"


# ---- samples with their blocks ------------------------------------------------------------------------
Blocked = tuple[np.ndarray, np.ndarray | None]     # values, each one's block id (None: the run is one block)


def _ids(s: Samples, n: int, what: str) -> np.ndarray | None | str:
    if s.block is None:
        return None
    if len(s.block) != n:
        return f"samples.block has {len(s.block)} entries for {n} {what}: not aligned, cannot pair blocks"
    return np.asarray(s.block)


def request_values(b: BenchReport, metric: str, chunk: bool = False) -> Blocked | str:
    """One value per request with its block: TTFT, TPOT, or each request's mean ITL gap (the gaps of
    one request are not independent draws; `itl_means` when a baseline kept only those). Chunk-level
    ITL (the server batches its stream) uses TPOT; `chunk`: the other side is chunk-level, so both do."""
    s = b.samples if b.samples is not None else Samples()
    key = "tpot" if metric == "tpot_ms" or (metric == "itl_ms" and (chunk or b.itl_level == "chunk")) else metric[:-3]
    if key == "itl" and s.itl_means:
        vals, ids = np.asarray(s.itl_means, dtype=float), _ids(s, len(s.itl_means), "itl_means")
    elif key == "itl":
        if not s.itl or not s.itl_counts or sum(s.itl_counts) != len(s.itl):
            return "no per-request ITL samples with counts"
        counts = np.asarray(s.itl_counts)
        ids = _ids(s, len(counts), "itl_counts")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[counts > 0]
        vals = np.add.reduceat(np.asarray(s.itl, dtype=float), starts) / counts[counts > 0]
        if isinstance(ids, np.ndarray):
            ids = ids[counts > 0]
    else:
        got = getattr(s, key)
        if not got:
            return f"no per-request {key} samples"
        own = s.tpot_block if key == "tpot" and s.tpot_block is not None and len(s.tpot_block) == len(got) else None
        vals, ids = np.asarray(got, dtype=float), (np.asarray(own) if own is not None else _ids(s, len(got), key))
    if isinstance(ids, str):
        return ids
    if not len(vals):
        return "no request with ITL gaps"
    return vals, ids


# A side whose client timed TPOT on fewer than this share of its multi-token requests has no interval to
# give: too few requests, and only those the client's stalls spared. The check is then inconclusive and
# slo.statistics.inconclusive decides (validation/gate.py _untimed): fail by default. Measured on the
# real local A/A (docs/measurements.md, 2026-12-06, load 8-12 on 2 cores): a side timed 2 to 12 of its 16
# requests, the others received in one read after a stall (their TTFT then holds their whole decode).
TPOT_COVERAGE_MIN = 0.25


def tpot_coverage(b: BenchReport) -> str | None:
    """Why this run's TPOT cannot be judged (too few multi-token requests timed), or None when it can.
    A report without `tpot_unmeasured` (from before the count) takes every successful request as
    multi-token: the stricter reading."""
    ok = b.requests_ok or 0
    why = b.tpot_unmeasured or {}
    multi = ok - why.get("one_token", 0)
    if multi <= 0:
        return None     # no multi-token request: nothing to time, the TPOT checks say "no samples"
    s = b.samples    # the summary's count covers every request; samples may be a truncated subset
    timed = b.tpot_ms.count if b.tpot_ms is not None and b.tpot_ms.count is not None else (
        len(s.tpot) if s is not None and s.tpot is not None else None)
    if timed is None or timed >= TPOT_COVERAGE_MIN * multi:   # None: no count at all (a summary-only report,
        return None                                           # judged on its point estimate, said as such)
    reasons = ", ".join(f"{n} {k}" for k, n in why.items() if k != "one_token") or "no reasons recorded"
    return (f"TPOT timed on {timed} of {multi} multi-token requests (< {TPOT_COVERAGE_MIN:.0%}; untimed: {reasons}): "
            "the client saw too little of decode to bound TPOT; its own stalls are the usual cause "
            "(client_health): re-run on a less loaded client")


def gap_values(b: BenchReport) -> Blocked | str:
    """Every ITL gap with its request's block (absolute ITL thresholds on token-level streams)."""
    s = b.samples if b.samples is not None else Samples()
    if not s.itl or not s.itl_counts or sum(s.itl_counts) != len(s.itl):
        return "ITL gaps without their per-request counts (a report from before itl_counts)"
    counts = np.asarray(s.itl_counts)
    ids = _ids(s, len(counts), "itl_counts")
    if isinstance(ids, str):
        return ids
    # a run without blocks: batches of consecutive requests, so a request's gaps stay together
    req_ids = ids if ids is not None else np.asarray(stats.batches(len(counts)))
    return np.asarray(s.itl, dtype=float), np.repeat(req_ids, counts)


# ---- the checks ---------------------------------------------------------------------------------------
def absolute(values: Blocked, q: float, limit: float, bud: Budget, st: Statistics, look: int) -> Judged:
    """An SLO threshold on the q-quantile: Woodruff's interval with blocks as clusters (a run without
    blocks: consecutive batches, stats.batches)."""
    vals, ids = values
    clusters = ids if ids is not None else np.asarray(stats.batches(len(vals)))
    bq = stats.quantile_ci_blocks(vals, clusters, q)
    a, b = bud.alpha, bud.beta
    lo, up = bq.bounds(1 - a, 1 - b)   # the quantile's interval: reported, and the resolution below
    # the verdict: the share above the limit against 1 - q (stats.exceedance says why not Woodruff's bounds)
    ex = stats.exceedance(vals, clusters, limit, q)
    ex_lo, ex_up = ex.bounds(1 - a, 1 - b)
    verdict = "pass" if ex_up <= 1 - q else "fail" if ex_lo > 1 - q else "inconclusive"
    ok, note = policy(verdict, bq.estimate <= limit, st, look)
    # resolution: how far from the estimate the pass (upper) bound sits; a run passes reliably when its
    # true quantile is below limit / (1 + resolution)
    res = up / bq.estimate - 1 if bq.estimate > 0 and math.isfinite(up) else math.inf
    how = (f"{bq.blocks} blocks" if ids is not None else f"{bq.blocks} batches of consecutive requests (no blocks)")
    one = "block" if ids is not None else f"batch (batches of >= {stats.BATCH_MIN} requests)"
    need = "" if bq.blocks >= 2 else (f"; {bq.n} samples cannot bound a p{stats.q_name(q)}: one {one}, so no "
                                      "block-level variance and no interval")
    if bq.blocks >= 2 and verdict == "inconclusive":
        need = f"; {bq.n} samples cannot show the share above {limit:g} ms within {1 - q:.1%}: raise the requests"
    msg = (f"{ex.above} of {ex.n} above the limit ({ex.share:.2%}, bounds [{_pct(max(ex_lo, 0.0))} ({1 - a:.2%}), "
           f"{_pct(ex_up)} ({1 - b:.1%})] vs {1 - q:.0%} allowed); quantile bounds [{_f(lo)}, {_f(up)}] ms "
           f"(Woodruff, {how}, n={bq.n}): {verdict}{note}; resolution +{_pct(res)}; {bud.text()}{need}")
    return Judged(verdict, ok, msg, (lo, up), 1 - b, {"resolution": res, "passes_below": limit / (1 + res)}, a)


def _pairs(c: Blocked, s: Blocked) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    (cv, ci), (sv, si) = c, s
    if ci is None or si is None:
        return [cv], [sv], "one block" if ci is None and si is None else (
            "the candidate's run has no blocks" if ci is None else "the baseline's run has no blocks")
    common = sorted(set(ci.tolist()) & set(si.tolist()))
    return [cv[ci == k] for k in common], [sv[si == k] for k in common], f"block ids on both sides: {len(common)}"


def detectable_ratio(log_se: float, pairs: int, factor: float, alpha: float, beta: float) -> float:
    """The true ratio rolled back with probability 1 - beta: the estimate must clear both the factor and
    the proof of a slowdown (lower bound at 1 - alpha above 1), with beta to spare."""
    if pairs < 2 or not math.isfinite(log_se):
        return math.inf
    need = max(math.log(factor), log_se * stats.small_k_factor(pairs, 1 - alpha))
    return math.exp(need + log_se * stats.small_k_factor(pairs, 1 - beta))


def vs_baseline(cand: Blocked, base: Blocked, q: float, factor: float, bud: Budget, st: Statistics,
                look: int) -> Judged:
    """The candidate's q-quantile against the baseline's, block k against block k (stats.paired_quantile_ratio).

    fail: proven slower than the baseline (lower bound at 1 - alpha above 1) AND beyond the factor (the
    estimate): an unchanged or faster candidate fails at most alpha of the time, whatever the run's
    size. inconclusive: fewer than 2 block pairs, or a run too small to catch a regression of factor^3
    with probability 1 - beta (it could promote a real regression). pass: otherwise. Each check states
    the ratio it catches with 1 - beta (`rolled_back_from`)."""
    cb, bb, how = _pairs(cand, base)
    a, b = bud.alpha, bud.beta
    if len(cb) < 2:
        point = stats.quantile(np.sort(cand[0]), q) / stats.quantile(np.sort(base[0]), q)
        ok, note = policy("inconclusive", point <= factor, st, look)
        msg = (f"p{stats.q_name(q)} {point:.3f}x baseline (pooled point estimate); {len(cb)} block pair ({how}): "
               f"no block-level variance, so no interval: inconclusive{note}; raise slo.vs_stable.blocks "
               "(at least 2 interleaved blocks per side)")
        return Judged("inconclusive", ok, msg, None, 1 - b, {"ratio": point}, a)
    r = stats.paired_quantile_ratio(cb, bb, q)
    lo, up = r.bounds(1 - a, 1 - b)
    caught = detectable_ratio(r.log_se, r.pairs, factor, a, b)
    verdict = ("fail" if lo > 1 and r.estimate > factor else "inconclusive" if caught > factor ** 3 else "pass")
    ok, note = policy(verdict, r.estimate <= factor, st, look)
    why = {"fail": f"proven slower than the baseline (lower bound > 1) and beyond {factor}x",
           "inconclusive": f"this run cannot catch a {factor ** 3:.2f}x regression (factor cubed) with "
                           f"{1 - b:.0%}: raise slo.vs_stable.blocks or the requests",
           "pass": f"not proven slower beyond {factor}x"}[verdict]
    msg = (f"p{stats.q_name(q)} {r.estimate:.3f}x baseline, bounds [{_f(lo, 'x')} ({1 - a:.2%}), {_f(up, 'x')} "
           f"({1 - b:.1%})] ({r.method}) vs limit {factor}x: {verdict}: {why}{note}; a {caught:.3f}x candidate is "
           f"rolled back with {1 - b:.0%}; an unchanged one at most {a:.3%} of the time ({bud.text()})")
    return Judged(verdict, ok, msg, (lo, up), 1 - b,
                  {"ratio": r.estimate, "log_se": r.log_se, "pairs": float(r.pairs), "rolled_back_from": caught}, a)


def load_count(benches: Sequence[object], planned: Sequence[object] | None) -> int:
    """How many loads the budget is split over: the release's plan, else the runs given."""
    return len(planned) if planned is not None else max(1, len(benches))
