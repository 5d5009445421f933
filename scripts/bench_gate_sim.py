"""The gate's error rates for the WHOLE decision, measured on a world that can break it (issue 21).

Each simulated release runs the real `validation.gate.decide` on synthetic bench reports (counts,
per-request outcomes, samples with their blocks: what `pdops bench` writes for an interleaved run)
drawn from a world with what real serving has:

- per-block noise: every block of every side has its own latency scale, lognormal sd `--block-noise`
  (5 %: a slower minute, a noisy neighbour);
- queueing correlation within a block: consecutive requests share the queue, AR(1) with `--phi` on
  log TTFT and log TPOT;
- bursts: in a block, with probability `--burst-p`, a run of 10 consecutive requests shares a batch
  slowdown of x1.6;
- tail-only regressions: the p90 +15 % with the median unchanged (log deviations above the median
  stretched);
- a stable release under user load: the contrast row compares with the user-facing stable slot,
  slower by `--user-load` (what the gate did before the baseline slot), which hides regressions.

Printed: the A/A false-rollback rate of the whole decision (target <= 5 %), detection of a uniform
+15 % regression (target >= 95 %) and of a p90-only +15 % (target >= 90 %) at the planned sizes, and
the scheduled canary's false alarms per 30 days of 48 runs a day (validation/sequential.py CUSUM).

    .venv/bin/python scripts/bench_gate_sim.py            # the table in docs/gate.md "Error rates"
    .venv/bin/python scripts/bench_gate_sim.py --quick    # a smoke run (tests/unit/test_bench_gate_sim.py)
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation import gate, interim, judge, metrics, sequential, stats
from validation.config import SLO, DecodeSLO, LoadProfile, PrefillSLO, Statistics, VsStable
from validation.reports.bench import BenchReport

COMPAT = {"ok": True, "passed": 1, "required_failures": [], "cases": []}
Z90 = 1.2815515655446004


def _ar1(rng: np.random.Generator, shape: tuple[int, int], phi: float, sd: float) -> np.ndarray:
    e = rng.normal(0, sd * math.sqrt(1 - phi ** 2), shape)
    x = np.empty(shape)
    x[:, 0] = rng.normal(0, sd, shape[0])
    for i in range(1, shape[1]):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return x


def side(rng: np.random.Generator, a: argparse.Namespace, scale: float = 1.0, tail: float = 1.0) -> dict:
    """One side's interleaved run of one load: a bench report with samples and blocks."""
    k, n = a.blocks, a.requests // a.blocks
    block = rng.normal(0, a.block_noise, (k, 1))
    burst = np.ones((k, n))
    for b in np.flatnonzero(rng.random(k) < a.burst_p):
        start = rng.integers(0, max(1, n - 10))
        burst[b, start:start + 10] = 1.6
    lt = _ar1(rng, (k, n), a.phi, 0.3)
    if tail != 1.0:       # stretch above the median: p90 x tail, median unchanged
        lt = np.where(lt > 0, lt * (1 + math.log(tail) / (Z90 * 0.3)), lt)
    ttft = 200 * scale * np.exp(block + lt) * burst
    tpot = 20 * scale * np.exp(block + _ar1(rng, (k, n), a.phi, 0.15)) * np.sqrt(burst)
    itl = 20 * scale * np.exp(block + _ar1(rng, (k, n), a.phi, 0.15))
    errs = rng.random((k, n)) < a.error_rate
    ok = ~errs
    t, p, i = ttft[ok].round(3), tpot[ok].round(3), itl[ok].round(3)
    ids = np.repeat(np.arange(k), n).reshape(k, n)
    total = k * n
    return {"kind": "bench", "profile": "balanced", "load": {"mode": "closed", "concurrency": a.concurrency},
            "itl_level": "token", "requests_total": total, "requests_ok": int(ok.sum()), "errors": int(errs.sum()),
            "error_rate": float(errs.mean()), "ttft_ms": metrics.summary(t.tolist()),
            "tpot_ms": metrics.summary(p.tolist()), "itl_ms": metrics.summary(i.tolist()),
            "client_health": {"client_bottleneck": False, "reasons": []},
            "samples": {"ttft": t.tolist(), "tpot": p.tolist(), "itl": i.tolist(), "itl_counts": [1] * len(i),
                        "block": ids[ok].tolist(), "outcomes": ok.ravel().astype(int).tolist(),
                        "outcome_block": ids.ravel().tolist()}}


def release_slo(a: argparse.Namespace, limits: dict[str, float] | None = None) -> SLO:
    """Prod's checks (overlays/prod/release.yaml): six absolute quantiles, three vs_stable p90s, errors.
    `limits`: the absolute limits instead of prod's (the A/A at the SLO row: each at the world's own quantile)."""
    lim = limits or {"ttft_p90_ms": 1500, "ttft_p99_ms": 3000, "itl_p90_ms": 50, "itl_p99_ms": 100,
                     "tpot_p90_ms": 40, "tpot_p99_ms": 80}
    return SLO(prefill=PrefillSLO(ttft_p90_ms=lim["ttft_p90_ms"], ttft_p99_ms=lim["ttft_p99_ms"]),
               decode=DecodeSLO(itl_p90_ms=lim["itl_p90_ms"], itl_p99_ms=lim["itl_p99_ms"],
                                tpot_p90_ms=lim["tpot_p90_ms"], tpot_p99_ms=lim["tpot_p99_ms"]),
               max_error_rate=0.001, kv_transfer="ignored",
               vs_stable=VsStable(ttft_p90=a.factor, tpot_p90=a.factor, itl_p90=a.factor),
               statistics=Statistics(stop_early=not a.no_stop_early))


def world_quantiles(rng: np.random.Generator, a: argparse.Namespace, sides: int = 40) -> dict[str, float]:
    """The unchanged candidate's own p90 and p99 of TTFT, ITL and TPOT, pooled over many simulated runs:
    the limits at which every absolute check sits exactly on its null (the worst case for false rollback)."""
    pooled: dict[str, list[float]] = {"ttft": [], "itl": [], "tpot": []}
    for _ in range(sides):
        s = side(rng, a)["samples"]
        for k in pooled:
            pooled[k] += s[k]
    out = {}
    for k, v in pooled.items():
        arr = np.sort(np.asarray(v))
        for q in (0.9, 0.99):
            out[f"{k}_p{q * 100:g}_ms"] = float(stats.quantile(arr, q))
    return out


def prefix(report: dict, blocks: int) -> dict:
    """The candidate's report as an interim look sees it: its first `blocks` blocks (validation/interleave.py
    asks the look with the kept blocks so far)."""
    s = report["samples"]
    keep = [i for i, b in enumerate(s["block"]) if b < blocks]
    out_keep = [i for i, b in enumerate(s["outcome_block"]) if b < blocks]
    outcomes = [s["outcomes"][i] for i in out_keep]
    samples = {k: [s[k][i] for i in keep] for k in ("ttft", "tpot", "itl", "itl_counts", "block")}
    samples.update(outcomes=outcomes, outcome_block=[s["outcome_block"][i] for i in out_keep])
    ok = sum(outcomes)
    return {**report, "requests_total": len(outcomes), "requests_ok": ok, "errors": len(outcomes) - ok,
            "error_rate": (len(outcomes) - ok) / max(1, len(outcomes)),
            "ttft_ms": metrics.summary(samples["ttft"]), "tpot_ms": metrics.summary(samples["tpot"]),
            "itl_ms": metrics.summary(samples["itl"]), "samples": samples}


def stopped_early(report: dict, slo: SLO, bud: judge.Budget, blocks: int) -> bool:
    """Would an interim look (validation/interim.py, at its planned block pairs) have stopped this load?"""
    return any(interim.look(BenchReport.coerce(prefix(report, k)), slo, bud) for k in interim.points(blocks))


def rollback_rate(rng: np.random.Generator, a: argparse.Namespace, releases: int, scale: float = 1.0,
                  tail: float = 1.0, user_load: float = 1.0,
                  limits: dict[str, float] | None = None) -> tuple[float, dict[str, int]]:
    """Share of releases rolled back, and which checks failed how often. With slo.statistics.stop_early,
    every load's interim looks are taken on its first blocks (as validation/interleave.py does): a stop
    rolls the release back (counted as `stopped_early`), whatever the final gate would have said."""
    slo = release_slo(a, limits)
    planned = [LoadProfile(profile="balanced", concurrency=a.concurrency + j, requests=a.requests)
               for j in range(a.loads)]
    bud = judge.budget(slo, len(planned))
    failed: dict[str, int] = {}
    back = 0
    for _ in range(releases):
        cand, base = [], []
        for j in range(a.loads):
            c, s = side(rng, a, scale, tail), side(rng, a, user_load)
            c["load"]["concurrency"] = s["load"]["concurrency"] = a.concurrency + j
            cand.append(c)
            base.append(s)
        stops = slo.statistics.stop_early and any(stopped_early(c, slo, bud, a.blocks) for c in cand)
        d = gate.decide(COMPAT, cand, slo, base, planned=planned)
        back += d.verdict == "rollback" or stops
        for c in d.checks:
            if not c.ok:
                failed[c.check] = failed.get(c.check, 0) + 1
        if stops:
            failed["stopped_early"] = failed.get("stopped_early", 0) + 1
    return back / releases, failed


def canary_false_alarms(rng: np.random.Generator, a: argparse.Namespace, months: int) -> float:
    """False alarms per 30 days of 48 canary runs a day on an unchanged stable release: each run a paired
    comparison of 8 blocks of 25 requests with its baseline, fed to the CUSUM (validation/sequential.py)."""
    cfg = sequential.CanaryConfig()
    runs = 48 * 30
    alarms = 0
    small = argparse.Namespace(**{**vars(a), "blocks": 8, "requests": 200})
    for _ in range(months):
        history: list[sequential.RunStat] = []
        for _ in range(runs):
            c, s = side(rng, small), side(rng, small)
            cb = [np.asarray(c["samples"]["ttft"])[np.asarray(c["samples"]["block"]) == k] for k in range(8)]
            sb = [np.asarray(s["samples"]["ttft"])[np.asarray(s["samples"]["block"]) == k] for k in range(8)]
            r = stats.paired_quantile_ratio(cb, sb, 0.9)
            history.append(sequential.RunStat(math.log(r.estimate), r.log_se))
            alarms += sequential.canary_decision(history, cfg).alarm
    return alarms / months


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=int, default=200, help="simulated releases per row")
    p.add_argument("--requests", type=int, default=2400, help="requests per side per load (LoadProfile.requests)")
    p.add_argument("--blocks", type=int, default=48, help="block pairs per load (slo.vs_stable.blocks)")
    p.add_argument("--loads", type=int, default=3, help="loads per release (prod: 3)")
    p.add_argument("--factor", type=float, default=1.1, help="vs_stable factor (prod: 1.1)")
    p.add_argument("--block-noise", type=float, default=0.05)
    p.add_argument("--phi", type=float, default=0.6, help="AR(1) queueing correlation within a block")
    p.add_argument("--burst-p", type=float, default=0.2)
    p.add_argument("--error-rate", type=float, default=0.0002)
    p.add_argument("--user-load", type=float, default=1.08, help="slowdown of the user-facing stable slot")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--months", type=int, default=4, help="simulated 30-day months of canary runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smoke run: few releases, small runs, one month")
    p.add_argument("--no-stop-early", action="store_true",
                   help="slo.statistics.stop_early: false (no interim looks; the whole budget on the final checks)")
    p.add_argument("--at-limit", action="store_true",
                   help="add the A/A at the SLO row: every absolute limit at the world's own quantile")
    a = p.parse_args(argv)
    if a.quick:
        a.releases, a.requests, a.blocks, a.loads, a.months = 6, 800, 16, 1, 0
    rng = np.random.default_rng(a.seed)
    slo = release_slo(a)
    m = len(judge.planned_checks(slo)) * a.loads
    bud = judge.budget(slo, a.loads)
    looks = (f"interim looks after block pairs {interim.points(a.blocks)} of {a.blocks} on "
             f"{len(judge.interim_planned(slo))} checks per load at p < {bud.interim_alpha:.2g} each "
             f"({judge.INTERIM_SHARE:.0%} of the budget over {bud.interim_tests} interim tests)"
             if slo.statistics.stop_early else "no interim looks (stop_early off)")
    print(f"# world: {a.loads} loads x {a.requests} requests per side in {a.blocks} block pairs; block noise "
          f"{a.block_noise:.0%}, AR(1) phi {a.phi}, bursts p {a.burst_p}, error rate {a.error_rate:.2%}; "
          f"vs_stable {a.factor}x on ttft/tpot/itl p90; {m} planned checks; false_rollback 5% "
          f"(alpha {bud.alpha:.3%} each), missed_regression 5%; {looks}; {a.releases} releases per row")
    print("| scenario | rolled back | target | most frequent failing check | stopped early |")
    print("| --- | --- | --- | --- | --- |")
    rows: list[tuple[str, dict, str]] = [("A/A (unchanged candidate)", {}, "<= 5%"),
            ("uniform +15% (TTFT, TPOT, ITL)", {"scale": 1.15}, ">= 95%"),
            ("p90-only +15% TTFT, median unchanged", {"tail": 1.15}, ">= 90%"),
            ("uniform +15% vs the user-facing stable under user load", {"scale": 1.15, "user_load": a.user_load},
             "(contrast)"),
            ("uniform 3x (ITL p90 about 61 ms against prod's 50 ms): a clear absolute failure", {"scale": 3.0},
             "100%, stopped early")]
    t0 = time.time()
    if a.at_limit and a.releases:
        limits = world_quantiles(rng, a)
        rows.insert(1, ("A/A at the SLO (every absolute limit at the candidate's own quantile: "
                        + ", ".join(f"{k} {v:.1f}" for k, v in limits.items()) + ")", {"limits": limits},
                        "stops <= 0.05% (a quantile at its limit is not proven within it: the final checks fail "
                        "it by design)"))
    for name, kw, target in rows if a.releases else []:
        rate, failed = rollback_rate(rng, a, a.releases, **kw)
        top = max(((k, v) for k, v in failed.items() if k != "stopped_early"), key=lambda kv: kv[1],
                  default=("-", 0))
        print(f"| {name} | {rate:.1%} | {target} | {top[0]} ({top[1]}) | {failed.get('stopped_early', 0)} of "
              f"{a.releases} |", flush=True)
    if a.months:
        per = canary_false_alarms(rng, a, a.months)
        print(f"\ncanary (CUSUM k 0.5, h 6, 48 runs a day): {per:.2f} false alarms per 30 days "
              f"({a.months} simulated months)")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
