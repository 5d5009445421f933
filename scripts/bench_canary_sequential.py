"""The scheduled canary as a sequential test (validation/canary.py): false alarms per 30 days of 48 runs
a day, and the detection delay (runs) of a sustained 15 % regression, measured by simulation.

The world: each run's latency figure is log-normal around the release's level with per-run noise
`--sd` (log units) and AR(1) correlation `--phi` between consecutive runs (the hour's load, noisy
neighbours), the same for each of `--checks` independent checks, plus a fixed offset (the stable
slot under user traffic is slower than its promotion run; the self-starting CUSUM does not care).
A/A: 30 days unchanged, count months with at least one alarm. Regression: after `--before` calm runs
every figure of one check rises by `--detect` and stays there; the delay is the runs until an alarm.

  python scripts/bench_canary_sequential.py                 # the table in docs/canary.md
  python scripts/bench_canary_sequential.py --months 10 --regressions 20   # a quick look
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from validation import canary


def series(rng: np.random.Generator, n: int, sd: float, phi: float) -> np.ndarray:
    e, out = rng.normal(0, sd), np.empty(n)
    for i in range(n):
        e = phi * e + math.sqrt(1 - phi * phi) * rng.normal(0, sd)
        out[i] = e
    return out + 0.07


def first_alarm(worlds: list[np.ndarray], design: canary.CanaryDesign) -> int | None:
    """The run (1-based) of the first alarm of any check, or None."""
    history = None
    for i in range(len(worlds[0])):
        stats = {f"load/check-{j}": float(w[i]) for j, w in enumerate(worlds)}
        history, _ = canary.record(history, "sha256:x", f"run-{i}", 0.0, stats, design)
        if any(v.get("h") and v["s"] > v["h"] for v in history["keys"].values()):
            return i + 1
    return None


def measure(rng: np.random.Generator, a: argparse.Namespace, sd: float, phi: float) -> tuple[float, list[float]]:
    design = canary.CanaryDesign(detect=a.detect, budget=a.budget, rho=a.rho)
    months = [first_alarm([series(rng, design.window, sd, phi) for _ in range(a.checks)], design) is not None
              for _ in range(a.months)]
    delays = []
    for _ in range(a.regressions):
        worlds = [series(rng, a.before + a.after, sd, phi) for _ in range(a.checks)]
        worlds[0][a.before:] += math.log(a.detect)
        hit = first_alarm(worlds, design)
        delays.append(math.inf if hit is None or hit <= a.before else hit - a.before)
    return float(np.mean(months)), delays


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sd", type=float, nargs="+", default=[0.03, 0.06], help="per-run noise sd of log(figure)")
    p.add_argument("--phi", type=float, nargs="+", default=[0.0, 0.3, 0.6], help="lag-1 correlation of runs")
    p.add_argument("--checks", type=int, default=3, help="latency checks judged (one CUSUM each)")
    p.add_argument("--detect", type=float, default=1.15)
    p.add_argument("--budget", type=float, default=0.05, help="chance of a false alarm per 30 days")
    p.add_argument("--rho", type=float, default=0.3, help="the correlation the design assumes")
    p.add_argument("--months", type=int, default=60, help="simulated 30-day A/A months per row")
    p.add_argument("--regressions", type=int, default=60)
    p.add_argument("--before", type=int, default=48, help="calm runs before the regression")
    p.add_argument("--after", type=int, default=240, help="runs after it (a miss: no alarm within them)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    print(f"# canary CUSUM: detect {a.detect}x, budget {a.budget:.0%} per 30 days (48 runs a day), assumed rho "
          f"{a.rho}, {a.checks} checks; {a.months} A/A months and {a.regressions} regressions after "
          f"{a.before} calm runs per row")
    print("| run-to-run sd | correlation phi | P(false alarm in 30 days) | delay median (runs) | p90 | missed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for sd in a.sd:
        for phi in a.phi:
            fa, d = measure(rng, a, sd, phi)
            fin = [x for x in d if math.isfinite(x)]
            med = f"{np.median(d):.0f}" if len(fin) > len(d) / 2 else "-"
            p90 = f"{np.percentile(d, 90):.0f}" if len(fin) >= 0.9 * len(d) else f"> {a.after}"
            print(f"| {sd} | {phi} | {fa:.1%} | {med} | {p90} | {1 - len(fin) / len(d):.0%} |", flush=True)
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
