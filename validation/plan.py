"""`pdops plan-load`: how many requests a run needs, from a pilot run's spread.

The gate's vs_stable rule (validation/verdicts.py) compares per-request log latencies with the
Hodges-Lehmann shift and its Mann-Whitney interval. Its standard error is about
sigma * sqrt(pi/3) * sqrt(1/n_candidate + 1/n_stable), sigma the spread of log latency: pi/3 is the
rank test's cost against a t-test on normal data (asymptotic relative efficiency 3/pi), exact enough
for planning and checked by scripts/bench_gate.py (at sigma 0.3, factor 1.1, 95%/95%, three
comparisons: 296 requests planned; the Monte Carlo's false-rollback rate is 17% at 200, 4.6% at 300).
A release with m vs_stable comparisons and K planned looks judges each at 1 - (1 - C) / (m K).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from validation.config import SLO
from validation.stats import z_of

_ARE = math.pi / 3


def log_sigma(vals: Sequence[float]) -> float:
    """Spread of log latency, robust to a few outliers: IQR of the logs / 1.349 (normal scale)."""
    v = np.log(np.asarray([x for x in vals if x and x > 0], dtype=float))
    if len(v) < 4:
        raise ValueError(f"{len(v)} positive samples: a pilot needs at least 4")
    q1, q3 = np.percentile(v, [25, 75])
    return float((q3 - q1) / 1.349) or float(v.std(ddof=1))


def per_side(sigma: float, effect: float, z_total: float) -> int:
    """Requests per side for a log-shift `effect` (> 0) to sit z_total standard errors away."""
    if effect <= 0:
        return math.inf  # type: ignore[return-value]
    return math.ceil(2 * _ARE * (sigma * z_total / effect) ** 2)


def smallest_detectable(sigma: float, n: int, confidence: float, power: float, comparisons: int = 1) -> float:
    """The regression (fraction) a run of n requests per side tells from none with `power`."""
    zz = z_of(1 - (1 - confidence) / comparisons) + z_of(power)
    return math.exp(zz * sigma * math.sqrt(_ARE * 2 / n)) - 1


def gate_requests(sigma: float, factor: float, regression: float, slo: SLO, comparisons: int) -> dict:
    """Requests per side the release's own rule needs: an unchanged candidate passes with `power`
    (upper bound <= factor), and a `regression` is rolled back with `power`. With inconclusive: fail
    the second holds as soon as the regression is at least the factor; with extend the regression
    must be proven beyond the factor (lower bound > factor) by the last look."""
    st = slo.statistics
    looks = st.max_looks if st.inconclusive == "extend" else 1
    zz = z_of(1 - (1 - st.confidence) / (looks * max(1, comparisons))) + z_of(st.power)
    n_pass = per_side(sigma, math.log(factor), zz)
    if st.inconclusive == "extend":
        n_fail = per_side(sigma, math.log1p(regression) - math.log(factor), zz)
    else:
        n_fail = 0 if 1 + regression >= factor else per_side(sigma, math.log(factor) - math.log1p(regression), zz)
    total = max(n_pass, n_fail)
    return {"unchanged_passes": n_pass, "regression_rolled_back": n_fail, "requests": total,
            "first_look": math.ceil(total / looks) if math.isfinite(total) else total, "looks": looks}


def quantile_min_requests(q: float, confidence: float) -> int:
    """Fewest samples with an upper bound for the q-quantile at all: 1 - q^n >= confidence."""
    return math.ceil(math.log(1 - confidence) / math.log(q))
