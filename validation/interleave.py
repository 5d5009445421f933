"""Candidate and stable measured in the same release, interleaved (issue 15, `slo.vs_stable.measure: live`).

A baseline recorded when the stable release was promoted was measured on another day: whatever
drifted since (a noisy neighbour, a driver, thermal throttling, this CPU machine's other jobs) shows
up as a candidate regression or hides one. Measuring stable in the same release removes the days
between; interleaving removes the minutes: each load runs in `blocks` blocks in the order
C S S C C S S C ... (ABBA, the classic counterbalanced design), so a drift that is linear in time over
the load adds the same to both sides' mean and cancels in the comparison, which a plain C-then-S
(AB) order does not (there the whole drift lands on one side).

Both slots serve during a release (the local target's two Ray Serve apps, the Kubernetes target's
two RayServices), and only one side is loaded at a time, so on one machine they do not compete for
the cores. The per-request samples of each side's blocks are merged (validation/sequential.py
`merge_bench`) into one run per side, which the gate's rank tests (validation/verdicts.py) compare.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from validation.reports.bench import BenchReport, Interleaved
from validation.sequential import merge_bench

Side = Literal["candidate", "stable"]
# run(side, requests, duration_s, warmup_requests, block) -> the bench of one block on that side
RunBlock = Callable[[Side, int | None, float | None, int, int], BenchReport | dict[str, Any]]


def order(blocks: int) -> list[Side]:
    """C S S C C S S C ...: `blocks` blocks per side, each pair alternating which side goes first."""
    out: list[Side] = []
    for k in range(blocks):
        out += ["candidate", "stable"] if k % 2 == 0 else ["stable", "candidate"]
    return out


def split(total: int, blocks: int) -> list[int]:
    """`total` requests as `blocks` near-equal block sizes (the first blocks take the remainder)."""
    base, extra = divmod(total, blocks)
    return [base + (1 if k < extra else 0) for k in range(blocks)]


def effective_blocks(requests: int | None, blocks: int, trace: bool) -> int:
    """A trace replays its own arrival times, so it is not cut: one block per side (C then S).
    A count load never gets blocks smaller than 2 requests (a block of one is all warm-up noise)."""
    if trace:
        return 1
    if requests is not None:
        return max(1, min(blocks, requests // 2))
    return blocks


def measure(run: RunBlock, requests: int | None, duration_s: float | None, warmup: int, blocks: int,
            trace: bool = False) -> tuple[BenchReport, BenchReport]:
    """One load on both sides, interleaved; the candidate's and the stable's merged benches.
    Each side's first block gets the load's warm-up requests; later blocks none (already warm)."""
    n = effective_blocks(requests, blocks, trace)
    sizes: list[int | None] = list(split(requests, n)) if requests is not None and not trace else [requests] * n
    durations = [duration_s / n if duration_s else None] * n
    merged: dict[Side, BenchReport] = {}
    seen = {"candidate": 0, "stable": 0}
    for side in order(n):
        k = seen[side]
        seen[side] += 1
        bench = BenchReport.coerce(run(side, sizes[k], durations[k], warmup if k == 0 else 0, k))
        merged[side] = merge_bench(merged[side], bench) if side in merged else bench
    label = "".join("C" if s == "candidate" else "S" for s in order(n))
    for side in merged:   # merge_bench's `looks` are this side's blocks here, not sequential looks
        per_block, merged[side].looks = merged[side].looks, None
        merged[side].interleaved = Interleaved(blocks=n, order=label, per_block=per_block)
    return merged["candidate"], merged["stable"]
