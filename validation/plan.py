"""`pdops plan-load`: how many block pairs a load needs, from a pilot run's BLOCK-level spread.

The gate compares the candidate's named quantile with the baseline's block pair by block pair
(validation/judge.py vs_baseline): the comparison's standard error is the spread of the per-pair log
ratios over sqrt(pairs), and with 5 % block-to-block noise and queueing correlation that spread comes
from the blocks, not from the request count alone (4 blocks of 400 requests know less than 32 of 50).
So the plan reads the pilot's per-block quantiles: the sd of log Q over its blocks, times sqrt(2) for
a pair of independent blocks (candidate and baseline), gives the pair spread; the blocks needed are the
fewest k whose check rolls back a `regression` with probability 1 - missed_regression at its budget
share alpha (judge.detectable_ratio: the same rule the gate applies), for exactly the checks
judge.planned_checks lists and the budget judge.budget splits. A pilot without blocks is cut into
consecutive batches (stats.batches), which sees queueing correlation but not minute-to-minute noise:
run the pilot interleaved (any release's bench with blocks) for a plan that does.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from validation import judge, stats


def log_sigma(vals: Sequence[float]) -> float:
    """Spread of log latency, robust to a few outliers: IQR of the logs / 1.349 (normal scale)."""
    v = np.log(np.asarray([x for x in vals if x and x > 0], dtype=float))
    if len(v) < 4:
        raise ValueError(f"{len(v)} positive samples: a pilot needs at least 4")
    q1, q3 = np.percentile(v, [25, 75])
    return float((q3 - q1) / 1.349) or float(v.std(ddof=1))


def quantile_min_requests(q: float, confidence: float) -> int:
    """Fewest independent samples with an upper bound for the q-quantile at all: 1 - q^n >= confidence."""
    return math.ceil(math.log(1 - confidence) / math.log(q))


@dataclass(frozen=True)
class BlockSpread:
    pair_sd: float          # sd of log(Qc_k / Qb_k) for one pair of independent blocks
    blocks: int             # the pilot's blocks (or batches)
    per_block: int          # requests per block in the pilot
    batches: bool           # the pilot had no blocks: consecutive batches stood in


def block_spread(vals: np.ndarray, ids: np.ndarray | None, q: float) -> BlockSpread:
    """The pilot's per-block spread of log q-quantile, as the spread of a candidate/baseline pair."""
    batched = ids is None
    ids = np.asarray(stats.batches(len(vals))) if ids is None else ids
    keys = np.unique(ids)
    logs = np.asarray([math.log(stats.quantile(np.sort(vals[ids == k]), q)) for k in keys])
    if len(logs) < 2:
        raise ValueError(f"{len(vals)} samples in {len(logs)} block: a pilot needs at least 2 blocks "
                         f"(or {2 * stats.BATCH_MIN} requests)")
    return BlockSpread(math.sqrt(2) * float(logs.std(ddof=1)), len(logs), len(vals) // len(logs), batched)


def caught_at(spread: BlockSpread, k: int, factor: float, alpha: float, beta: float) -> float:
    """The ratio a check of k block pairs rolls back with 1 - beta."""
    return judge.detectable_ratio(spread.pair_sd / math.sqrt(k), k, factor, alpha, beta)


def blocks_needed(spread: BlockSpread, factor: float, regression: float, alpha: float, beta: float,
                  most: int = 4096) -> int | None:
    """Fewest block pairs (>= 2) whose check rolls back a 1 + regression candidate with 1 - beta; None
    when the regression is within the factor (the gate must not roll it back) or beyond `most`."""
    target = 1 + regression
    if target <= factor:
        return None
    lo, hi = 2, most
    if caught_at(spread, hi, factor, alpha, beta) > target:
        return None
    while lo < hi:                      # detectable ratio falls with k
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if caught_at(spread, mid, factor, alpha, beta) <= target else (mid + 1, hi)
    return lo


def gpu_minutes(requests: int, seconds_per_request: float, gpus: int) -> tuple[float, float]:
    """(wall minutes, GPU-minutes) of one load measured in paired blocks: both sides' requests run one
    after the other, and the candidate and the baseline deployment are both held for the whole load."""
    wall = 2 * requests * seconds_per_request / 60
    return wall, wall * gpus * 2
