"""The scheduled canary's decision across runs: a per-release run history and a self-starting CUSUM.

pd-canary re-validates the stable release every 30 minutes (48 runs a day). Judged run by run, its
latency checks raise a false alarm every few days at best (issue 21); so here:

- hard failures act at once: errors, compat, KV not moved, golden answers or the diff differ, engines
  replaced, a report that cannot be read -- every failed check that is not a latency figure -- and a
  latency figure at twice its limit or more (GROSS: not the noise of one look);
- latency acts only when a one-sided CUSUM (Page 1954) over the runs since the serving release
  started crosses its threshold. Each latency check of each load (absolute p90/p99 in ms, vs_stable
  ratios, goodput) contributes log(value) per run, one CUSUM per check.

Self-starting (Hawkins 1987, "Self-starting CUSUM charts for location and scale"): run n is
standardized by the mean and sd of the runs before it, T = (x_n - mean) / sd * sqrt((n-1)/n), and
mapped through Student's t with n-2 degrees of freedom to a N(0, 1) figure -- exact under iid normal
noise whatever n, so the first hours of a release need no separate learning phase and no baseline of
the absolute level (a stable slot under user traffic is slower than its promotion run; only change
since it started serving is judged). Consecutive runs are correlated (load of the hour, noisy
neighbours): the sd is inflated by sqrt((1 + rho) / (1 - rho)) for an assumed lag-1 correlation rho.
The reference value k is half the slowdown to catch (`detect`, 1.15x) in those units, and the
threshold h is the one whose in-control run length (Siegmund's approximation) spends the 30-day
false-alarm budget, split over the checks. scripts/bench_canary_sequential.py measures both the false
alarms per 30 days and the detection delay in a world with per-run noise and correlated runs
(docs/canary.md).

History (`record`): a JSON object per environment, tied to the serving release's digest (a new
release or a restore starts it again), keyed by run id (Argo's workflow uid), so a retried step
records nothing twice. Only running sums per check are kept, plus the last RECENT runs for the report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from validation.error_rates import betainc
from validation.judge import ABSOLUTE, VS
from validation.reports.decision import Check, Decision

RUNS_PER_DAY = 48
RECENT = 96                       # runs kept in the history for the report (two days)
LATENCY = {n for n, _, _ in ABSOLUTE} | {f"vs_stable_{n}" for n, _, _ in VS} | {"goodput_rps", "slo_attainment"}
GROSS = 2.0                       # a latency figure this many times its limit acts at once (hard_failures)
_N = NormalDist()


@dataclass(frozen=True)
class CanaryDesign:
    detect: float = 1.15           # the sustained slowdown to catch (ratio of a latency figure)
    budget: float = 0.05           # chance of one false alarm or more per 30 days, all checks together
    rho: float = 0.3               # assumed lag-1 correlation between consecutive runs
    start: int = 8                 # runs since the release started serving before the CUSUM judges (4 h)
    floor: float = 0.01            # smallest run-to-run sd of log(figure) believed (1 %)
    runs_per_day: int = RUNS_PER_DAY

    @property
    def window(self) -> int:
        return 30 * self.runs_per_day


def siegmund_arl(k: float, h: float) -> float:
    """In-control average run length of a one-sided CUSUM of N(0, 1) figures (Siegmund 1985)."""
    b = 2 * k * (h + 1.166)
    return (math.exp(b) - b - 1) / (2 * k * k)


def threshold(k: float, arl: float) -> float:
    """The smallest h whose in-control average run length is `arl`."""
    lo, hi = 0.0, 200.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if siegmund_arl(k, mid) < arl else (lo, mid)
    return hi


def _t_cdf(t: float, df: int) -> float:
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def latency_stats(decision: Decision) -> dict[str, float]:
    """log(value) of every latency check with a positive figure, keyed `<load>/<check>` (goodput and
    attainment negated: lower is worse, the CUSUM watches for a rise)."""
    out: dict[str, float] = {}
    for c in decision.checks:
        if c.check not in LATENCY or isinstance(c.value, list) or c.value is None:
            continue
        v = float(c.value)
        if v > 0 and math.isfinite(v):
            sign = -1.0 if c.check in ("goodput_rps", "slo_attainment") else 1.0
            out[f"{c.bench or 'release'}/{c.check}"] = sign * math.log(v)
    return out


def _gross(c: Check) -> bool:
    """A latency figure at GROSS times its limit or more (p90 ms against the SLO, a vs_stable ratio
    against its factor): not noise of one look, so it acts at once."""
    return (c.check not in ("goodput_rps", "slo_attainment") and isinstance(c.value, (int, float))
            and isinstance(c.limit, (int, float)) and c.limit > 0 and c.value >= GROSS * c.limit)


def hard_failures(decision: Decision) -> list[Check]:
    """Failed checks that act at once: everything but a latency figure (a latency check with no figure
    at all, value null, is a measurement that failed, so it is hard too), and a latency figure at
    GROSS times its limit. `stopped_early` (validation/interim.py) is not one of them by itself: the checks
    that stopped the run are in the decision, judged on what was measured, and act (or feed the CUSUM) as
    they would have at the end."""
    return [c for c in decision.checks if not c.ok and c.check != "stopped_early"
            and (c.check not in LATENCY or c.value is None or _gross(c))]


def empty(release: str) -> dict[str, Any]:
    return {"release": release, "runs_since_reset": 0, "keys": {}, "recent": []}


def _step(state: dict[str, float], x: float, design: CanaryDesign, n_keys: int) -> dict[str, float]:
    """One run of one check: the self-starting CUSUM's update, then the running sums (Welford)."""
    n, mean, m2, s = int(state.get("n", 0)), state.get("mean", 0.0), state.get("m2", 0.0), state.get("s", 0.0)
    out = {"n": n + 1, "s": s, "z": 0.0, "h": 0.0, "k": 0.0}
    if n >= max(design.start, 3):
        inflate = math.sqrt((1 + design.rho) / (1 - design.rho))
        sd = max(math.sqrt(m2 / (n - 1)), design.floor)
        t = (x - mean) / sd * math.sqrt(n / (n + 1))
        z = _N.inv_cdf(min(max(_t_cdf(t, n - 1), 1e-15), 1 - 1e-15)) / inflate
        k = min(max(math.log(design.detect) / (2 * sd * inflate), 0.25), 3.0)
        arl = n_keys * design.window / design.budget          # Bonferroni over the checks
        s = max(0.0, s + z - k)
        out.update(s=s, z=z, k=k, h=threshold(k, arl))
    delta = x - mean
    mean += delta / (n + 1)
    out.update(mean=mean, m2=m2 + delta * (x - mean))
    return out


def record(history: dict[str, Any] | None, release: str, run_id: str, at: float,
           stats: dict[str, float], design: CanaryDesign = CanaryDesign()) -> tuple[dict[str, Any], bool]:
    """`history` with one canary run added: (new history, added). A history of another release starts
    again (a new release or a restore); a run id already recorded is not added again (a retried step)."""
    if history is None or history.get("release") != release:
        history = empty(release)
    if any(r.get("run") == run_id for r in history["recent"]):
        return history, False
    keys = dict(history["keys"])
    n_keys = max(len(set(keys) | set(stats)), 1)
    for key, x in stats.items():
        keys[key] = _step(keys.get(key, {}), x, design, n_keys)
    entry = {"run": run_id, "at": at, "stats": stats,
             "cusum": {k: round(keys[k]["s"], 4) for k in stats}}
    out = {"release": release, "runs_since_reset": int(history["runs_since_reset"]) + 1, "keys": keys,
           "recent": (history["recent"] + [entry])[-RECENT:]}
    return out, True


@dataclass(frozen=True)
class CanaryVerdict:
    """What one canary run decided: act (roll back / alert) on hard failures at once, on latency only
    when a CUSUM crossed its threshold; `lines` say the CUSUMs, thresholds, runs since reset and the
    false-alarm rate per 30 days."""

    act: bool
    hard: list[str]
    alarms: list[str]
    lines: list[str]

    @property
    def reasons(self) -> list[str]:
        return self.hard + self.alarms


def false_alarms_per_window(keys: dict[str, dict[str, float]], design: CanaryDesign) -> float:
    """Expected false alarms per 30 days at the thresholds now in force (Siegmund, iid runs), all checks
    together; before any CUSUM has started, the design's budget."""
    live = [v for v in keys.values() if v.get("h")]
    if not live:
        return -math.log(1 - design.budget)
    return sum(design.window / siegmund_arl(v["k"], v["h"]) for v in live)


def decide(decision: Decision, history: dict[str, Any], design: CanaryDesign = CanaryDesign()) -> CanaryVerdict:
    """The canary's verdict on this run, `history` already holding it (`record`)."""
    hard = [c.message for c in hard_failures(decision)]
    keys: dict[str, dict[str, float]] = history.get("keys", {})
    alarms = [f"{key}: sustained slowdown: CUSUM {v['s']:.2f} > h {v['h']:.2f}" for key, v in sorted(keys.items())
              if v.get("h") and v["s"] > v["h"]]
    n = int(history.get("runs_since_reset", 0))
    fa = false_alarms_per_window(keys, design)
    lines = [f"canary: {n} runs since the serving release {str(history.get('release', ''))[7:19]} started "
             f"(history resets on a new release or a restore); hard failures act at once, latency on the CUSUM",
             f"false alarms: <= {design.budget:.0%} chance of one per 30 days of {design.runs_per_day} runs a day "
             f"(all checks; {fa:.3f} expected per 30 days at these thresholds, iid runs; assumed run-to-run "
             f"correlation {design.rho}; measured: docs/canary.md); detects a sustained {design.detect:.2f}x"]
    if n <= design.start:
        lines.append(f"latency CUSUM starts after {design.start} runs ({n} so far): latency does not act yet")
    for key, v in sorted(keys.items()):
        if v.get("h"):
            lines.append(f"  {key}: CUSUM {v['s']:.2f} / h {v['h']:.2f} (k {v['k']:.2f}, run z {v['z']:+.2f}, "
                         f"{int(v['n'])} runs)")
    latency_failed = [c for c in decision.checks
                      if not c.ok and c.check in LATENCY and c.value is not None and not _gross(c)]
    if latency_failed and not alarms:
        lines.append(f"{len(latency_failed)} latency checks failed this run alone: not acted on (one look of many; "
                     "the CUSUM decides)")
    return CanaryVerdict(bool(hard or alarms), hard, alarms, lines)

