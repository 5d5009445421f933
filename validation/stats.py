"""The statistics the gate rests on: quantile confidence intervals, the Mann-Whitney rank test and
the Hodges-Lehmann shift with its confidence interval. scipy is not installed; everything here is
numpy plus the standard library, pinned against published values in tests/unit/test_stats.py.

Choices, and why:
- Quantile interval: the order-statistic (binomial) interval. For n independent draws from a
  continuous distribution, P(X_(l) <= xi_q) = P(Binomial(n, q) >= l) exactly, whatever the
  distribution: no resampling, no shape assumed, computed in microseconds. A bootstrap of a p90
  from 16-128 draws is itself noisy and under-covers in the tail. The price is honesty: with
  n < 29 no upper bound of a p90 exists at 95% (1 - 0.9^28 < 0.95), with n < 299 none of a p99.
- Samples that are not independent (the ITL gaps of one request share its batch) use Woodruff's
  interval with the cluster-robust variance of the empirical CDF at the estimate (requests as
  clusters); with one gap per request it reduces to the normal approximation of the binomial.
- Location shift: Mann-Whitney U (as Kayenta's MannWhitneyClassifier does,
  spinnaker/kayenta kayenta-judge/.../classifiers/metric/MannWhitneyClassifier.scala) with the
  normal approximation, tie correction and continuity correction (scipy.stats.mannwhitneyu's
  `method="asymptotic"`), and the Hodges-Lehmann estimate with the distribution-free interval
  from the U distribution (Hollander & Wolfe; Kayenta's and R's `wilcox.test(conf.int=TRUE)`).
  Applied to log latencies, a shift is a ratio: "candidate is 1.12x stable [1.05, 1.19]".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

_N = NormalDist()
Floats = Sequence[float] | np.ndarray   # a list of samples, or numpy's array of them


def z_of(confidence: float) -> float:
    """One-sided normal quantile: 1.645 for a confidence of 0.95."""
    return _N.inv_cdf(confidence)


def percentile(sorted_vals: Floats, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default; validation.metrics uses it)."""
    k = (len(sorted_vals) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(sorted_vals) - 1)
    return float(sorted_vals[f] + (sorted_vals[c] - sorted_vals[f]) * (k - f))


@lru_cache(maxsize=4096)
def quantile_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) with P(X_(l) <= xi_q) >= confidence and P(X_(u) >= xi_q) >= confidence.
    l = 0 means no lower bound exists (-inf), u = n + 1 no upper bound (+inf)."""
    # cdf[k] = P(Binomial(n, q) <= k), summed in log space (n up to the sample cap, 20,000)
    lq, l1q = math.log(q), math.log1p(-q)
    logpmf = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q
              for k in range(n + 1)]
    m = max(logpmf)
    pmf = [math.exp(v - m) for v in logpmf]
    tot = sum(pmf)
    cdf, acc = [], 0.0
    for p in pmf:
        acc += p
        cdf.append(acc / tot)
    # lower: the largest l with P(B >= l) = 1 - cdf[l-1] >= confidence
    lo = 0
    for lr in range(1, n + 1):
        if 1 - cdf[lr - 1] >= confidence - 1e-12:
            lo = lr
        else:
            break
    # upper: the smallest u with P(B <= u - 1) = cdf[u-1] >= confidence
    up = next((u for u in range(1, n + 1) if cdf[u - 1] >= confidence - 1e-12), n + 1)
    return lo, up


@dataclass(frozen=True)
class Interval:
    estimate: float
    lower: float          # one-sided bounds, each holding with `confidence`: -inf / inf when none exists
    upper: float
    confidence: float
    n: int
    method: str


def quantile_ci(samples: Sequence[float], q: float, confidence: float,
                cluster_sizes: Sequence[int] | None = None) -> Interval:
    """Estimate and one-sided bounds of the q-quantile (0 < q < 1). `cluster_sizes`: the samples
    come in consecutive groups of these sizes (ITL gaps per request); the bounds then use Woodruff's
    interval with requests as clusters."""
    v = np.sort(np.asarray(samples, dtype=float))
    n = len(v)
    if n == 0:
        raise ValueError("no samples")
    est = percentile(v, q)
    if cluster_sizes is None or len(cluster_sizes) == n:
        lo, up = quantile_ranks(n, round(q, 9), round(confidence, 12))
        return Interval(est, float(v[lo - 1]) if lo >= 1 else -math.inf, float(v[up - 1]) if up <= n else math.inf,
                        confidence, n, "order statistic (binomial)")
    sizes = np.asarray(cluster_sizes, dtype=int)
    if sizes.sum() != n:
        raise ValueError(f"cluster sizes sum to {sizes.sum()}, samples are {n}")
    raw = np.asarray(samples, dtype=float)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])[sizes > 0]
    sizes = sizes[sizes > 0]          # a one-token request has no gaps: no cluster
    below = np.add.reduceat((raw <= est).astype(float), starts)
    k = len(sizes)
    p = below.sum() / n
    var = k / max(k - 1, 1) * float(np.sum((below - p * sizes) ** 2)) / n ** 2
    half = z_of(confidence) * math.sqrt(var)

    def at(pp: float) -> float:
        if pp <= 0:
            return -math.inf
        if pp >= 1:
            return math.inf
        return float(v[min(n - 1, max(0, math.ceil(pp * n) - 1))])
    # an upper rank beyond the data is no bound at all, as for the exact interval
    upper = at(p + half) if p + half < 1 - 1 / (2 * n) else math.inf
    return Interval(est, at(p - half), upper, confidence, k, f"Woodruff, {k} requests as clusters of {n} samples")


@dataclass(frozen=True)
class MannWhitney:
    u: float              # U of the candidate (x): pairs x > y, ties counting 1/2
    z: float
    p_greater: float      # one-sided: x stochastically greater than y (candidate slower)
    p_two_sided: float
    sd: float             # tie-corrected standard deviation of U under H0


def mann_whitney(x: Floats, y: Floats) -> MannWhitney:
    """Normal approximation with tie and continuity corrections (scipy's asymptotic method)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples must be non-empty")
    allv = np.concatenate([x, y])
    _, inv, counts = np.unique(allv, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0
    r1 = float(avg_rank[inv[:n1]].sum())
    u = r1 - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    tie = float(np.sum(counts.astype(float) ** 3 - counts))
    var = n1 * n2 / 12.0 * ((n + 1) - tie / (n * (n - 1))) if n > 1 else 0.0
    sd = math.sqrt(max(var, 0.0))
    mu = n1 * n2 / 2.0
    if sd == 0:
        return MannWhitney(u, 0.0, 1.0, 1.0, 0.0)
    zg = (u - mu - 0.5) / sd
    z2 = (abs(u - mu) - 0.5) / sd
    return MannWhitney(u, (u - mu) / sd, 1 - _N.cdf(zg), min(1.0, 2 * (1 - _N.cdf(z2))), sd)


def _kth_differences(xs: np.ndarray, ys: np.ndarray, ks: list[int]) -> list[float]:
    """The ks-th smallest (1-based) of the n1*n2 differences x_i - y_j, both arrays sorted."""
    # all differences and one partition when few; else bisection on the value with O(n log n) counts
    # (measured here: n=500 per side 66 ms partition vs 13 ms bisection, n=1500 1.1 s vs 51 ms)
    if len(xs) * len(ys) <= 20_000:
        d = np.subtract.outer(xs, ys).ravel()
        part = np.partition(d, sorted({k - 1 for k in ks}))
        return [float(part[k - 1]) for k in ks]
    out = []
    for k in ks:
        lo, hi = xs[0] - ys[-1], xs[-1] - ys[0]
        for _ in range(200):  # bisection on the value: count(t) = #{x_i - y_j <= t}
            mid = (lo + hi) / 2
            if np.searchsorted(xs, ys + mid, side="right").sum() >= k:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-12 * max(1.0, abs(hi)):
                break
        out.append(float(hi))
    return out


def hodges_lehmann(x: Sequence[float], y: Sequence[float], confidence: float) -> Interval:
    """Shift x - y: the median of the pairwise differences, one-sided bounds at `confidence` each
    from the order statistics of the differences at the U critical value (tie-corrected sd)."""
    xs, ys = np.sort(np.asarray(x, dtype=float)), np.sort(np.asarray(y, dtype=float))
    n1, n2 = len(xs), len(ys)
    nn = n1 * n2
    sd = mann_whitney(xs, ys).sd
    k = math.floor(nn / 2.0 - z_of(confidence) * sd)   # P(U < k) ~ 1 - confidence
    ks = [(nn + 1) // 2, nn // 2 + 1] + ([k, nn + 1 - k] if k >= 1 else [])
    v = _kth_differences(xs, ys, ks)
    mid = (v[0] + v[1]) / 2
    if k < 1:
        return Interval(mid, -math.inf, math.inf, confidence, min(n1, n2), "Hodges-Lehmann")
    return Interval(mid, v[2], v[3], confidence, min(n1, n2), "Hodges-Lehmann")


def shift_ratio(candidate: Sequence[float], stable: Sequence[float], confidence: float) -> Interval:
    """Hodges-Lehmann shift of log latencies as a ratio candidate/stable with its bounds."""
    c = np.log(np.asarray([v for v in candidate if v > 0], dtype=float))
    s = np.log(np.asarray([v for v in stable if v > 0], dtype=float))
    if len(c) == 0 or len(s) == 0:
        raise ValueError("no positive samples")
    hl = hodges_lehmann(c, s, confidence)
    return Interval(math.exp(hl.estimate), math.exp(hl.lower), math.exp(hl.upper), confidence, hl.n,
                    "Hodges-Lehmann shift of log latency (Mann-Whitney interval)")
