"""Phase balance: which side of a P/D release queues in a benchmark run, and by how much to grow it.

The rule (docs/adoption.md#phase-balance), after NVIDIA Dynamo's planners:
  waiting/engine = requests waiting for capacity on the phase's engines, time-averaged over the run
                   (sampled gauges; without 2 samples in the window, Little's law on the queue-time
                   histogram: summed queue time / window), divided by the phase's engines
  pressure       = waiting/engine / validation.balance.queue_per_engine (default 5.0), and for decode
                   also mean KV-cache usage / validation.balance.kv_usage (default 0.9): the load-based
                   planner's prefill_queue_scale_up_threshold and decode_kv_scale_up_threshold
                   (components/planner/src/dynamo/planner/defaults.py LoadPlannerDefaults)
  a phase queues when its pressure >= 1; verdict: neither -> balanced, one -> `<phase>-bound`,
  both -> the higher pressure (equal -> balanced: both sides are short, nothing to rebalance)
  replicas for the bound phase = max(engines + 1, ceil(engines x max((running + waiting) / running,
                   KV usage / kv_usage))): grow linearly with the queued work, as the SLA planner
                   does for prefill ("we assume the prefill bias is purely due to request queueing and
                   we increase the number of prefill replicas linearly", planner/utils/planner_core.py)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from validation.config import BalancePolicy
from validation.reports.bench import BenchReport

Verdict = Literal["prefill-bound", "decode-bound", "balanced", "unknown"]
PHASES = ("prefill", "decode")
RULE = ("a phase queues when waiting requests per engine >= queue_per_engine (or, for decode, mean KV-cache "
        "usage >= kv_usage); the one that queues more is the bound side")


class PhaseLoad(BaseModel):
    """One phase's engines over one run (validation/phase_load.figures) and what the rule read."""

    phase: str
    engines: int
    window_s: float
    gauge_samples: int
    waiting_mean: float | None = None       # summed over the phase's engines, sampled
    waiting_max: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    kv_usage_mean: float | None = None      # per engine, 1 = full
    kv_usage_max: float | None = None
    waiting_little: float | None = None     # summed queue time / window
    running_little: float | None = None     # summed inference time / window
    queue_ms_mean: float | None = None
    queue_ms_p90: float | None = None
    requests: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    # what the rule read
    waiting_per_engine: float | None = None
    waiting_from: Literal["gauges", "queue-time histogram", "none"] = "none"
    pressure: float | None = None
    queues: bool = False


class Suggestion(BaseModel):
    phase: str
    engines: int          # engines the run had
    replicas: int         # engines that would have served its load without the queue
    basis: str


class Balance(BaseModel):
    verdict: Verdict
    rule: str = RULE
    policy: BalancePolicy
    reasons: list[str]
    phases: dict[str, PhaseLoad]
    suggestion: Suggestion | None = None


def _read(p: PhaseLoad, policy: BalancePolicy) -> PhaseLoad:
    engines = max(p.engines, 1)
    if p.gauge_samples >= 2 and p.waiting_mean is not None:
        wait, source = p.waiting_mean, "gauges"
    elif p.waiting_little is not None:
        wait, source = p.waiting_little, "queue-time histogram"
    else:
        return p
    pressures = [wait / engines / policy.queue_per_engine]
    if p.phase == "decode" and p.kv_usage_mean is not None:
        pressures.append(p.kv_usage_mean / policy.kv_usage)
    return p.model_copy(update={"waiting_per_engine": wait / engines, "waiting_from": source,
                                "pressure": max(pressures), "queues": max(pressures) >= 1.0})


def _suggest(p: PhaseLoad, policy: BalancePolicy) -> Suggestion:
    engines = max(p.engines, 1)
    running = p.running_mean if p.waiting_from == "gauges" else p.running_little
    factors, basis = [], []
    if running and p.waiting_per_engine is not None:
        factors.append((running + p.waiting_per_engine * engines) / running)
        basis.append(f"(running {running:.1f} + waiting {p.waiting_per_engine * engines:.1f}) / running {running:.1f}")
    if p.phase == "decode" and p.kv_usage_mean is not None and p.kv_usage_mean > policy.kv_usage:
        factors.append(p.kv_usage_mean / policy.kv_usage)
        basis.append(f"KV usage {p.kv_usage_mean:.2f} / {policy.kv_usage}")
    grown = math.ceil(engines * max(factors) - 1e-9) if factors else 0
    return Suggestion(phase=p.phase, engines=engines, replicas=max(engines + 1, grown),
                      basis=f"{engines} engine(s) x max({', '.join(basis) or 'no running figure'}), at least one more")


def _describe(p: PhaseLoad) -> str:
    if p.waiting_per_engine is None:
        return f"{p.phase}: no queue figures (no gauges sampled, no queue-time histogram)"
    kv = f", KV usage {p.kv_usage_mean:.2f}" if p.kv_usage_mean is not None else ""
    return (f"{p.phase}: {p.waiting_per_engine:.2f} waiting per engine ({p.waiting_from}, {p.engines} engine(s))"
            f"{kv}, queue time mean {_ms(p.queue_ms_mean)} -> pressure {p.pressure:.2f}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def judge(phases: dict[str, dict], policy: BalancePolicy | None = None) -> Balance:
    """The verdict of one run from its per-phase figures (validation/phase_load.measure)."""
    policy = policy or BalancePolicy()
    loads = {name: _read(PhaseLoad(**figs), policy) for name, figs in phases.items()}
    missing = [n for n in PHASES if n not in loads or loads[n].pressure is None]
    if missing:
        return Balance(verdict="unknown", policy=policy, phases=loads, reasons=[
            f"no per-phase queue figures for {', '.join(missing)}: the metrics endpoint must export each phase's "
            "engines (tagged sources or a phase label selection)"] + [_describe(p) for p in loads.values()])
    p, d = loads["prefill"], loads["decode"]
    reasons = [_describe(p), _describe(d)]
    queuing = [x for x in (p, d) if x.queues]
    if not queuing or (len(queuing) == 2 and p.pressure == d.pressure):
        why = "neither phase queues" if not queuing else "both phases queue equally: the release is short of both"
        return Balance(verdict="balanced", policy=policy, phases=loads, reasons=[why] + reasons)
    bound = max(queuing, key=lambda x: x.pressure or 0.0)
    if len(queuing) == 2:
        reasons.insert(0, f"both phases queue; {bound.phase} more (pressure {bound.pressure:.2f})")
    return Balance(verdict=f"{bound.phase}-bound", policy=policy, phases=loads, reasons=reasons,
                   suggestion=_suggest(bound, policy))


def trend_lines(benches_in: Sequence[BenchReport | dict[str, Any]],
                stable_in: Sequence[BenchReport | dict[str, Any]] | None) -> list[str]:
    """Each run's queues against the same load's run in `stable` (the baseline recorded when the release
    was promoted; for the canary, the stable release's own): how the balance moved since."""
    from validation.gate import bench_label

    benches = [BenchReport.coerce(b) for b in benches_in]
    stable = [BenchReport.coerce(s) for s in stable_in or []]

    def key(b: BenchReport) -> tuple[str | None, int | None, float | None, str | None]:
        return b.profile, b.load.concurrency, b.load.rate, b.load.trace

    earlier = {key(s): s for s in stable if s.balance}
    out = []
    for i, b in enumerate(benches):
        if not b.balance or key(b) not in earlier:
            continue
        now, then = Balance.model_validate(b.balance), Balance.model_validate(earlier[key(b)].balance)
        moves = [f"{n} waiting/engine {_num(then.phases[n].waiting_per_engine)} -> {_num(p.waiting_per_engine)}"
                 for n, p in now.phases.items() if n in then.phases]
        out.append(f"{bench_label(b, i)}: {then.verdict} -> {now.verdict} since the baseline run ({'; '.join(moves)})")
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown_lines(labels_and_benches: Sequence[tuple[str, BenchReport | dict[str, Any]]]) -> list[str]:
    """The report's phase-balance table and verdicts, for runs that carry a `balance`."""
    typed = [(lab, BenchReport.coerce(b)) for lab, b in labels_and_benches]
    runs = [(lab, Balance.model_validate(b.balance)) for lab, b in typed if b.balance]
    if not runs:
        return []
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)   # noqa: E731
    lines = ["## Phase balance (validation/balance.py)", "", f"Rule: {RULE}.", "",
             "| run | verdict | phase | engines | waiting/engine | from | running | KV usage | queue ms mean "
             "| prompt tok/s | generated tok/s | ITL p90 ms | pressure |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for lab, bal in runs:
        for name, p in bal.phases.items():
            running = p.running_mean if p.waiting_from == "gauges" else p.running_little
            lines.append(f"| {lab} | {bal.verdict} | {name} | {p.engines} | {f(p.waiting_per_engine)} "
                         f"| {p.waiting_from} "
                         f"| {f(running)} | {f(p.kv_usage_mean)} | {f(p.queue_ms_mean, '.0f')} "
                         f"| {f(p.prompt_tokens_per_s, '.1f')} | {f(p.generation_tokens_per_s, '.1f')} "
                         f"| {f(p.itl_ms_p90, '.1f')} | {f(p.pressure)} |")
    lines.append("")
    for lab, bal in runs:
        lines.append(f"- {lab}: **{bal.verdict}**: " + "; ".join(bal.reasons))
        if bal.suggestion:
            s = bal.suggestion
            lines.append(f"  - advice: {s.phase} {s.engines} -> {s.replicas} replicas ({s.basis}); "
                         "`pdops advise OVERLAY --bench FILE --out advice.patch` writes the checked patch")
    return lines + [""]
