"""vs_stable's baseline measured in the release: every load in paired blocks, candidate and baseline.

The baseline is the stable release deployed at its own size and loaded by nothing but the benchmark
(`Target.baseline_server`: the local target's stable slot, checked for foreign requests block by
block; on Kubernetes a `<name>-baseline` RayService), never the user-facing slot. The block design
(order, warm-up, ramp, void pairs) is validation/interleave.py's.

The baseline is held while the loads run and released before the single-engine reference starts
(on Kubernetes both would need room at once); an extended look takes it again. Where none can run,
or every pair of a load was void, `missing` says why and nothing is compared: the gate fails
vs_stable closed (or skips it under `slo.vs_stable.without_baseline: absolute_only`).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from validation import interim, interleave
from workflows.targets.base import Baseline, Endpoint, Progress, Skipped

if TYPE_CHECKING:
    from validation.config import LoadProfile
    from validation.reports import BenchReport


class BenchOf(Protocol):
    """bench_of(load, warmup, seed, on, requests, duration, stop=) -> one run of `load` against `on`,
    with the interim looks `stop` (validation/interim.py) when given."""

    def __call__(self, load: LoadProfile, warmup: int, seed: int, on: Endpoint | None = None,
                 requests: int | None = None, duration: float | None = None, *,
                 stop: interim.Stop | None = None) -> BenchReport: ...


class PairedLoads:
    """Each load on the candidate and the baseline in paired blocks; a context manager that always
    releases the baseline it took."""

    def __init__(self, server: Callable[[], AbstractContextManager[Baseline | Skipped]], bench_of: BenchOf,
                 candidate: Endpoint, blocks: int, progress: Progress, dump: Callable[[Path, object], None],
                 run: Path, client_required: bool = True) -> None:
        self.server, self.bench_of, self.candidate, self.blocks = server, bench_of, candidate, blocks
        self.client_required = client_required     # slo.client_health: required (a starved block voids its pair)
        self.progress, self.dump, self.run = progress, dump, run
        self.stable: dict[int, BenchReport] = {}   # load index -> the baseline's merged blocks
        self.missing: list[str] = []                # why a load (or all) had no baseline to compare with
        self.seed = interleave.new_seed()           # the order's seed; each bench's `interleaved.seed`
        self._stack: ExitStack | None = None
        self._baseline: Baseline | None = None
        self._skipped = False

    def __enter__(self) -> PairedLoads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def take(self) -> Baseline | None:
        """The baseline, started now unless held; None when it cannot run (said once, in `missing`)."""
        if self._baseline is not None or self._skipped:
            return self._baseline
        stack = ExitStack()
        got = stack.enter_context(self.server())
        if isinstance(got, Skipped):
            stack.close()
            self._skipped = True
            self.missing.append(f"no baseline could run: {got.reason}")
            self.progress(f"[validate] no baseline for vs_stable: {got.reason}")
            return None
        self._stack, self._baseline = stack, got
        self.progress(f"[validate] baseline {got.release} at {got.endpoint.base_url}: {got.how}")
        return got

    def release(self) -> None:
        stack, self._stack, self._baseline = self._stack, None, None
        if stack is not None:
            stack.close()

    def measure(self, i: int, load: LoadProfile, warmup: int, seed: int,
                stops: interim.Stops | None = None) -> BenchReport:
        """Load #i on the candidate, paired with the baseline when one runs (every block then gets the
        load's warm-up; alone, `warmup`); the candidate's bench. `stops`: the load's interim looks
        (slo.statistics.stop_early): between block pairs, or within the candidate's bench when alone."""
        alone = stops.alone if stops is not None else None
        baseline = self.take()
        if baseline is None:
            return self.bench_of(load, warmup, seed, self.candidate, None, None, stop=alone)
        before = self.stable[i].interleaved if i in self.stable else None
        first = before.first_block + before.blocks if before is not None else 0   # a later look's blocks follow
        order_seed = (before.seed if before is not None and before.seed is not None else self.seed + i) + 1000 * first
        self.progress(f"[validate] load #{i} {load.profile}: candidate and baseline in {self.blocks} block pairs, "
                      f"random order (seed {order_seed}), warm-up and a {load.ramp_s:g} s ramp at every block")

        def block(side: interleave.Side, n: int | None, dur: float | None, warmup: int, k: int) -> BenchReport:
            on = self.candidate if side == "candidate" else baseline.endpoint
            bench = self.bench_of(load, warmup, seed * 100 + k, on, n, dur)
            why = baseline.void_reason(bench) if side == "stable" else None
            starved = bench.client_health.starved() if self.client_required else None
            if why is None and starved is not None:
                # either side: a baseline timed by a starved client looks slower than it is, and every vs_stable
                # ratio against it would favour the candidate (a false promote)
                why = f"the client was starved: {starved}"
            if why:
                self.progress(f"[validate] block {k} on the {'baseline' if side == 'stable' else side} is void: {why}")
                raise interleave.VoidBlock(why)
            return bench

        try:
            cand, stab = interleave.measure(block, load.requests if not load.duration_s else None, load.duration_s,
                                            load.warmup_requests, self.blocks, bool(load.trace), seed=order_seed,
                                            first_block=first, stop=stops.blocks if stops is not None else None)
        except interleave.AllVoid as exc:
            self.missing.append(f"load #{i} {load.profile}: {exc}")
            self.progress(f"[validate] load #{i}: {exc}; the candidate is judged on the absolute SLOs only")
            return exc.candidate or self.bench_of(load, warmup, seed, self.candidate, None, None, stop=alone)
        if cand.stopped_early is not None:
            self.progress(f"[validate] load #{i}: {cand.stopped_early.reason}")
        self.stable[i] = interleave.combine(self.stable[i], stab) if i in self.stable else stab
        self.dump(self.run / f"stable-bench-{i}-{load.profile}.json", self.stable[i])
        return cand

    def mark(self, i: int) -> tuple[BenchReport | None, int]:
        """What load #i's baseline holds now, for `undo` after a run of the load that is thrown away."""
        return self.stable.get(i), len(self.missing)

    def undo(self, i: int, mark: tuple[BenchReport | None, int]) -> None:
        """Forget a run of load #i (a void one, measured again): its baseline blocks and what it said was missing."""
        before, missing = mark
        if before is None:
            self.stable.pop(i, None)
        else:
            self.stable[i] = before
        del self.missing[missing:]

    def benches(self) -> list[BenchReport]:
        return [self.stable[i] for i in sorted(self.stable)]
