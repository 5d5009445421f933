"""Errors as counts: exact tests on the number of failed requests (issue 21, "Errors as counts").

The candidate's errors are k failures in n measured requests, recomputed from the report's
per-request outcomes (`samples.outcomes`, validation/metrics.py) when it has them, else its
`errors` / `requests_total` counts (validated first by validation/gate_inputs.py; a summary
`error_rate` is never read).

- Against the tolerance (`slo.max_error_rate`): a one-sided Clopper-Pearson test. The candidate is
  rolled back only when the exact lower confidence bound of its error rate exceeds the tolerance, so
  a single error at the planned n cannot trip a non-zero tolerance (1 error in 300 requests has a
  95 % lower bound of 0.017 %: under any tolerance >= 0.02 %). Each check states how many errors at
  this n roll back, and which true error rate is caught with the planned power.
  `max_error_rate: 0` is zero tolerance: any error rolls back, and the check says so.
- Against the baseline at the same load (when one ran): Fisher's exact test, one-sided (the
  candidate fails more often than the baseline), failing when significant.

No scipy in the environment: the binomial tail is the regularized incomplete beta function
(continued fraction, Numerical Recipes 6.4) and the hypergeometric tail a sum of lgamma terms; both
are pinned against published values (R's binom.test / fisher.test examples) in
tests/unit/test_gate_failclosed.py.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from validation.reports.bench import BenchReport
from validation.reports.decision import Check

_EPS, _TINY = 1e-15, 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes betacf)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b), a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): I_p(k, n - k + 1)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return betainc(k, n - k + 1, p)


def _solve(f: Callable[[float], float], target: float) -> float:
    """The p in [0, 1] where the increasing function f crosses target (bisection to double precision)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-17:
            break
    return (lo + hi) / 2


def lower_bound(k: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson lower bound of a binomial proportion: the p at which k or more
    successes out of n have probability 1 - confidence (0 for k = 0)."""
    if k <= 0:
        return 0.0
    return _solve(lambda p: binomial_sf(k, n, p), 1.0 - confidence)


def errors_to_fail(n: int, tolerance: float, confidence: float) -> int | None:
    """The fewest errors out of n whose lower bound exceeds the tolerance (None: not even n do)."""
    if lower_bound(n, n, confidence) <= tolerance:
        return None
    lo, hi = 0, n        # lower_bound(lo) <= tolerance < lower_bound(hi); it increases with k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lower_bound(mid, n, confidence) <= tolerance else (lo, mid)
    return hi


def detectable_rate(n: int, k_fail: int, power: float) -> float:
    """The true error rate at which k_fail or more errors out of n happen with probability `power`."""
    return _solve(lambda p: binomial_sf(k_fail, n, p), power)


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(k_cand: int, n_cand: int, k_base: int, n_base: int) -> float:
    """One-sided Fisher exact p-value that the candidate's error rate exceeds the baseline's: with both
    sides' totals and the errors of both fixed, P(the candidate has k_cand or more of the errors)
    (hypergeometric; R `fisher.test(alternative = "greater")` on [[k_cand, n_cand - k_cand],
    [k_base, n_base - k_base]])."""
    errors, n = k_cand + k_base, n_cand + n_base
    top = min(errors, n_cand)
    if k_cand <= max(0, errors - n_base):
        return 1.0
    logs = [_log_choose(n_cand, x) + _log_choose(n_base, errors - x) for x in range(k_cand, top + 1)]
    peak = max(logs)
    return min(1.0, math.exp(peak - _log_choose(n, errors)) * sum(math.exp(v - peak) for v in logs))


def counts(b: BenchReport) -> tuple[int, int, str]:
    """(errors, requests, where from) of a report validated by gate_inputs: per-request outcomes when
    it has them, else its counts."""
    outcomes = b.samples.outcomes if b.samples is not None else None
    if outcomes is not None:
        return len(outcomes) - sum(outcomes), len(outcomes), "per-request outcomes"
    return int(b.errors or 0), int(b.requests_total or 0), "the report's counts"


def _errors(k: int, n: int) -> str:
    return f"{k} error{'s' if k != 1 else ''} in {n} requests"


def tolerance_check(b: BenchReport, lab: str, tolerance: float, confidence: float, power: float) -> Check:
    """`error_rate`: is the candidate's error rate proven above slo.max_error_rate?"""
    k, n, source = counts(b)
    if n == 0:
        return Check(check="error_rate", ok=False, bench=lab, value=None, limit=tolerance, verdict="fail",
                     message=f"{lab}: no request was measured, so no error rate (nothing proves the candidate serves)")
    rate = k / n
    head = f"{lab}: error rate {rate:.2%}: {_errors(k, n)} (from {source})"
    if tolerance == 0:
        return Check(check="error_rate", ok=k == 0, bench=lab, value=rate, limit=0.0,
                     verdict="pass" if k == 0 else "fail",
                     message=f"{head}; max_error_rate 0 is zero tolerance: any error rolls back")
    low = lower_bound(k, n, confidence)
    ok = low <= tolerance
    k_fail = errors_to_fail(n, tolerance, confidence)
    caught = detectable_rate(n, k_fail, power) if k_fail is not None else None
    reach = (f"at n={n}, {k_fail} errors ({k_fail / n:.2%}) roll back; a true error rate of {caught:.2%} is caught "
             f"with power {power:.0%}" if k_fail is not None and caught is not None else
             f"at n={n} no number of errors proves a rate above {tolerance:.2%}: this run cannot fail on errors "
             "(raise the load's requests)")
    return Check(check="error_rate", ok=ok, bench=lab, value=rate, limit=tolerance, verdict="pass" if ok else "fail",
                 interval=[low, None], confidence=confidence,
                 detectable={"errors_to_roll_back": None if k_fail is None else float(k_fail),
                             "rate": caught},
                 message=f"{head}; one-sided {confidence:.1%} lower bound {low:.3%} "
                         f"{'<=' if ok else '>'} max_error_rate {tolerance:.2%} (exact, Clopper-Pearson): "
                         f"{'pass' if ok else 'fail: proven above the tolerance'}; {reach}")


def baseline_check(b: BenchReport, baseline: BenchReport, lab: str, confidence: float) -> Check:
    """`errors_vs_baseline`: does the candidate fail more often than the baseline at the same load?"""
    (kc, nc, source), (kb, nb, _) = counts(b), counts(baseline)
    alpha = 1 - confidence
    if nc == 0 or nb == 0:
        return Check(check="errors_vs_baseline", ok=False, bench=lab, limit=alpha, verdict="fail",
                     message=f"{lab}: errors cannot be compared with the baseline: {nc} candidate and {nb} baseline "
                             "requests measured")
    p = fisher_greater(kc, nc, kb, nb)
    ok = p >= alpha
    return Check(check="errors_vs_baseline", ok=ok, bench=lab, value=p, limit=alpha, verdict="pass" if ok else "fail",
                 confidence=confidence,
                 message=f"{lab}: candidate {_errors(kc, nc)} ({kc / nc:.2%}, from {source}) vs baseline "
                         f"{_errors(kb, nb)} ({kb / nb:.2%}) at the same load: one-sided Fisher exact p = {p:.3g} "
                         + (f">= {alpha:.3g}: not proven worse" if ok else
                            f"< {alpha:.3g}: the candidate fails more often than the baseline"))
