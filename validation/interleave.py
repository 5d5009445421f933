"""Candidate and baseline measured in the same release, in paired blocks (issue 21, `slo.vs_stable.measure: live`).

Each choice of the design, and what it protects against:

- **Like against like.** The other side is a *baseline*: the stable release deployed at the
  candidate's size and given the same synthetic load in the same window (`Target.baseline_server`,
  workflows/targets), never the user-facing slot: user traffic there slows stable and leans the
  comparison toward the candidate. A baseline recorded on another day carries whatever drifted since.
- **Paired blocks.** A load runs as `blocks` pairs; a pair is one candidate block and one baseline
  block back to back with the same request count, prompts (one seed per pair) and load. Drift slower
  than a pair (the machine's other jobs, heat, a neighbour) hits both blocks of the pair alike. Every
  request carries its block (`Samples.block`, `Samples.outcome_block`) and the gate compares candidate
  block k with baseline block k, so drift between pairs and the correlation of requests within a
  block (shared queues and batches) are in the interval instead of assumed away.
- **Seeded random order within each pair, balanced.** Which side goes first in a pair is drawn from a
  recorded seed (`Interleaved.seed`: the order is reproducible): half the pairs start with each side
  (an odd count: the last by a coin flip), shuffled. A fixed C S S C order is balanced but predictable:
  a periodic disturbance in step with it (a cron job, an autoscaler tick) lands on one side.
  Independent coin flips are unpredictable but, with 4 pairs, put one side first in every pair 1
  time in 8, and an effect of going first (the second block runs on a machine the first has warmed)
  then lands wholly on that side. The shuffled balanced order has neither fault: a linear drift and a
  position effect cancel exactly, and nothing periodic can line up with it.
- **Warm-up at every block.** Between its blocks a side sits idle while the other is loaded: caches,
  the engine's scheduler and batch state, CPU frequency and the page cache go cold or belong to the
  other side. Every block first sends the load's `warmup_requests` one at a time, excluded from every
  figure (and sent before the server-metrics window opens), not only each side's first block.
- **A ramp, not a burst.** Each block's load rises over the load's `ramp_s` (closed loop: the slots
  start one by one; open loop: the rate rises linearly; validation/loadgen.py) instead of sending
  `concurrency` requests at once. A burst makes the first wave prefill together (its TTFTs measure
  that queue, not the steady state) and keeps equal-length requests in lockstep for the whole block
  (a convoy whose decode batches are not the steady state's). Requests that start in the ramp are
  MEASURED, not dropped: both blocks of a pair get the identical ramp, so its effect cancels in the
  paired comparison; a block of the local overlay holds 4 requests, and dropping the ramp's would
  leave almost nothing to compare; and an error in the ramp is an error a user would see, so it must
  count. The price: absolute quantiles are slightly optimistic (ramp requests see less than the stated
  concurrency), so ramp_s stays short against a block.
- **Open loop beside the closed loop.** A load with `rate` sends on a Poisson (or uniform) schedule
  whatever the server's speed, as users arrive; a closed loop slows its own arrivals when the server
  slows, which hides part of a regression's queueing. Either, per load (release.yaml
  `validation.load[].rate` / `arrival`; latency also from the scheduled send, against coordinated omission).
- **Void pairs.** A block that cannot be measured fairly (the baseline received requests that were not
  ours; the baseline went away) raises VoidBlock: its pair is dropped from both sides so the pairing
  stays intact, and `Interleaved.void` says which and why. A block whose requests fail is not void:
  errors are data, counted against their side. When every pair is void, AllVoid: nothing was compared.
- A trace replays its own arrival times: one pair.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from functools import reduce
from typing import Any, Literal

from validation.interim import points as interim_points
from validation.reports.bench import BenchReport, Interleaved, Quantiles, StoppedEarly, VoidPair
from validation.sequential import merge_bench

Side = Literal["candidate", "stable"]
SIDES: tuple[Side, Side] = ("candidate", "stable")
# run(side, requests, duration_s, warmup_requests, block) -> the bench of one block on that side
RunBlock = Callable[[Side, int | None, float | None, int, int], BenchReport | dict[str, Any]]
# stop(the candidate's kept blocks merged, pairs measured, pairs planned) -> an early stop, or None
StopCheck = Callable[[BenchReport, int, int], StoppedEarly | None]


class VoidBlock(Exception):
    """Raised by a RunBlock: this block could not be measured fairly; its pair is dropped."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class AllVoid(Exception):
    """Every pair was void: no comparison was made. `candidate`: the candidate's blocks that were
    measured (unpaired, for the absolute SLOs), or None when none was."""

    def __init__(self, void: list[VoidPair], candidate: BenchReport | None) -> None:
        self.void, self.candidate = void, candidate
        super().__init__("every block pair was void: " + "; ".join(f"pair {v.pair} {v.side}: {v.reason}"
                                                                    for v in void))


def other(side: Side) -> Side:
    return "stable" if side == "candidate" else "candidate"


def new_seed() -> int:
    """A fresh seed for a release's order (recorded in the report, so the order can be replayed)."""
    return random.SystemRandom().randrange(2**31)


def order(pairs: int, seed: int) -> list[tuple[Side, Side]]:
    """Each pair's two sides in the order they run: half the pairs start with each side (an odd
    count: the last one by a coin flip), shuffled, all drawn from `seed`."""
    rng = random.Random(seed)
    firsts: list[Side] = ["candidate", "stable"] * (pairs // 2)
    if pairs % 2:
        firsts.append(rng.choice(SIDES))
    rng.shuffle(firsts)
    return [(f, other(f)) for f in firsts]


def order_label(pairs: list[tuple[Side, Side]]) -> str:
    """e.g. CSSCSCCS: C candidate, S stable (the baseline), pair by pair."""
    return "".join("C" if s == "candidate" else "S" for pair in pairs for s in pair)


def split(total: int, blocks: int) -> list[int]:
    """`total` requests as `blocks` near-equal block sizes (the first blocks take the remainder)."""
    base, extra = divmod(total, blocks)
    return [base + (1 if k < extra else 0) for k in range(blocks)]


def effective_blocks(requests: int | None, blocks: int, trace: bool) -> int:
    """A trace replays its own arrival times, so it is not cut: one block per side (one pair).
    A count load never gets blocks smaller than 2 requests (a block of one is all warm-up noise)."""
    if trace:
        return 1
    if requests is not None:
        return max(1, min(blocks, requests // 2))
    return blocks


def labelled(bench: BenchReport, block: int) -> BenchReport:
    """The bench with every successful request and every outcome labelled with `block`
    (Samples.block aligned with ttft/itl_counts, tpot_block with tpot, outcome_block with outcomes)."""
    s = bench.samples
    if s is None:
        return bench
    ok = len(s.itl_counts) if s.itl_counts is not None else len(s.ttft or [])
    s.block = [block] * ok
    s.tpot_block = [block] * len(s.tpot) if s.tpot is not None else None   # tpot may hold fewer (reports/bench.py)
    s.outcome_block = [block] * len(s.outcomes) if s.outcomes is not None else None
    return bench


def block_summary(bench: BenchReport, side: Side, block: int) -> dict[str, Any]:
    q = lambda m: (getattr(bench, m) or Quantiles()).model_dump(mode="json")  # noqa: E731
    return {"block": block, "side": side, "requests_ok": bench.requests_ok, "errors": bench.errors,
            "wall_s": bench.wall_s, "ttft_ms": q("ttft_ms"), "tpot_ms": q("tpot_ms"), "itl_ms": q("itl_ms")}


def merged(benches: list[BenchReport]) -> BenchReport:
    """One side's kept blocks as one run (validation/sequential.py merge_bench; its `looks` are blocks here)."""
    out = reduce(merge_bench, benches) if len(benches) > 1 else benches[0].model_copy(deep=True)
    out.looks = None
    return out


def measure(run: RunBlock, requests: int | None, duration_s: float | None, warmup: int, blocks: int,
            trace: bool = False, seed: int | None = None, first_block: int = 0,
            stop: StopCheck | None = None) -> tuple[BenchReport, BenchReport]:
    """One load on both sides in paired blocks (module docstring): the candidate's and the baseline's
    merged benches, every request labelled with its block (first_block, first_block + 1, ...).
    Every block gets the load's warm-up. Raises AllVoid when no pair could be measured.
    `stop` (slo.statistics.stop_early, validation/interim.py): asked after the pairs at the interim
    looks (interim.points of the planned pairs) with the candidate's kept blocks so far; when it returns
    a record, the load ends there (no further pair) and the candidate's bench carries it."""
    n = effective_blocks(requests, blocks, trace)
    looks = set(interim_points(n)) if stop is not None else set()
    stopped: StoppedEarly | None = None
    seed = new_seed() if seed is None else seed
    sizes: list[int | None] = list(split(requests, n)) if requests is not None and not trace else [requests] * n
    durations = [duration_s / n if duration_s else None] * n
    pairs = order(n, seed)
    kept: dict[Side, list[BenchReport]] = {"candidate": [], "stable": []}
    summaries: dict[Side, list[dict[str, Any]]] = {"candidate": [], "stable": []}
    void: list[VoidPair] = []
    unpaired: list[BenchReport] = []   # candidate blocks whose baseline block was void
    for k, pair in enumerate(pairs):
        block = first_block + k
        got: dict[Side, BenchReport] = {}
        for side in pair:
            try:
                got[side] = labelled(BenchReport.coerce(run(side, sizes[k], durations[k], warmup, block)), block)
            except VoidBlock as exc:   # the pair's other block, measured or not, goes too
                void.append(VoidPair(pair=block, side=side, reason=exc.reason))
                break
        if len(got) < 2:
            unpaired += [got["candidate"]] if "candidate" in got else []
            continue
        for side, bench in got.items():
            kept[side].append(bench)
            summaries[side].append(block_summary(bench, side, block))
        if stop is not None and k + 1 in looks and len(kept["candidate"]) >= 2:
            stopped = stop(merged(kept["candidate"]), k + 1, n)
            if stopped is not None:
                break
    if not kept["candidate"]:
        raise AllVoid(void, merged(unpaired) if unpaired else None)
    out: dict[Side, BenchReport] = {}
    for side in SIDES:
        out[side] = merged(kept[side])
        out[side].interleaved = Interleaved(blocks=n, order=order_label(pairs), seed=seed, pairs=len(kept[side]),
                                            first_block=first_block, void=void, per_block=summaries[side])
    out["candidate"].stopped_early = stopped
    return out["candidate"], out["stable"]


def combine(a: BenchReport, b: BenchReport) -> BenchReport:
    """Two looks at one load (slo.statistics extend) as one run: merge_bench, and when both were
    measured in block pairs, one `interleaved` record covering the blocks of both."""
    out = merge_bench(a, b)
    ia, ib = a.interleaved, b.interleaved
    if ia is not None and ib is not None:
        out.looks = None
        out.interleaved = ib.model_copy(update={
            "blocks": ia.blocks + ib.blocks, "order": ia.order + ib.order, "seed": ia.seed,
            "first_block": ia.first_block, "pairs": (ia.pairs or 0) + (ib.pairs or 0), "void": ia.void + ib.void,
            "per_block": (ia.per_block or []) + (ib.per_block or [])})
    return out


def foreign_requests(bench: BenchReport) -> str | None:
    """Why a baseline block must not count, or None: its engines recorded more requests in the block's
    window than the benchmark sent (someone else's traffic slowed it), or the count could not be read
    (then foreign requests cannot be ruled out: fail closed). The engines' count is each phase's
    first-token histogram over the window (validation/server_metrics.py `requests_seen`); warm-up
    requests are sent before the window opens."""
    server = bench.server
    seen = server.requests_seen if server is not None else None
    if server is None or server.error or seen is None:
        why = server.error if server is not None and server.error else "no server metrics in the block's bench"
        return f"the baseline's own request count could not be read ({why}), so foreign requests cannot be ruled out"
    ours = bench.requests_total or 0
    if seen > ours:
        return (f"the baseline's engines recorded {seen:.0f} requests in the block's window, the benchmark sent "
                f"{ours}: {seen - ours:.0f} were not ours")
    return None

