"""False-rollback and detection rates of the gate, old (point estimates) vs new (intervals).

Many simulated releases: stable and candidate each measured with N requests in the same release
(the ideal interleaving), lognormal TTFT and per-request decode speed with per-gap jitter, the same
distributions the known-timing fake serves with its jitter option (tests/fakes/known_timing_server.py
ttft_spread / itl_spread / gap_spread). Thousands of releases through HTTP would take hours on this
machine, so the Monte Carlo samples those distributions directly; `--through-fake K` first runs K
releases through the fake and the real harness (validation.bench.run_bench) to show the path from
a served request to the gate is the same. Each release is judged by `validation.gate.decide`:
"old" on the bench reports without per-request samples (the point-estimate path, exactly the gate
before intervals: candidate p90 <= factor x stable p90), "new" on the same reports with them.

    .venv/bin/python scripts/bench_gate.py                      # the table in docs/measurements.md
    .venv/bin/python scripts/bench_gate.py --ttft-spread 0.5 --requests 128 500 --releases 200
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation import gate  # noqa: E402
from validation.config import SLO, Statistics, VsStable  # noqa: E402

COMPAT = {"ok": True, "passed": 1, "required_failures": [], "cases": []}
REGRESSIONS = (0.05, 0.10, 0.15, 0.25)


def _summary(v: np.ndarray) -> dict:
    q = np.percentile(v, [50, 90, 95, 99])   # linear interpolation, as validation.metrics.percentile
    return {"count": len(v), "mean": float(v.mean()), "p50": float(q[0]), "p90": float(q[1]),
            "p95": float(q[2]), "p99": float(q[3]), "max": float(v.max())}


def draw(rng, n: int, a, ttft_x: float = 1.0, itl_x: float = 1.0) -> dict:
    """One bench report of n requests (the fields the gate reads), with per-request samples."""
    ttft = a.ttft_ms * ttft_x * rng.lognormal(0.0, a.ttft_spread, n)
    speed = a.itl_ms * itl_x * rng.lognormal(0.0, a.itl_spread, n)
    gaps = speed[:, None] * rng.lognormal(0.0, a.gap_spread, (n, a.tokens - 1))
    tpot = gaps.mean(axis=1)
    flat = gaps.ravel()
    return {"kind": "bench", "profile": "balanced", "load": {"concurrency": 16}, "itl_level": "token",
            "ttft_ms": _summary(ttft), "tpot_ms": _summary(tpot), "itl_ms": _summary(flat),
            "requests_total": n, "requests_ok": n, "errors": 0, "error_rate": 0.0,
            "client_health": {"client_bottleneck": False},
            "samples": {"ttft": ttft.tolist(), "tpot": tpot.tolist(), "itl": flat.tolist(),
                        "itl_counts": [a.tokens - 1] * n}}


def merge(a: dict, b: dict) -> dict:
    """Two runs of the same load as one (what an extended look measures)."""
    s = {k: a["samples"][k] + b["samples"][k] for k in a["samples"]}
    return {**a, "requests_ok": a["requests_ok"] + b["requests_ok"], "samples": s,
            "requests_total": a["requests_total"] + b["requests_total"],
            **{f"{m}_ms": _summary(np.asarray(s[m])) for m in ("ttft", "tpot", "itl")}}


def bare(b: dict) -> dict:
    return {k: v for k, v in b.items() if k != "samples"}


def release(rng, n: int, a, slo_old: SLO, slo_new: SLO, slo_ext: SLO, ttft_x: float, itl_x: float) -> tuple:
    """(old rolls back, new rolls back, new+extend rolls back, requests per side used by extend)."""
    st, cand = draw(rng, n, a), draw(rng, n, a, ttft_x, itl_x)
    old = gate.decide(COMPAT, [bare(cand)], slo_old, [bare(st)]).verdict == "rollback"
    new = gate.decide(COMPAT, [cand], slo_new, [st]).verdict == "rollback"
    used, look = n, 1
    while True:
        d = gate.decide(COMPAT, [cand], slo_ext, [st], look=look)
        if not d.extend:
            break
        look += 1
        st, cand, used = merge(st, draw(rng, n, a)), merge(cand, draw(rng, n, a, ttft_x, itl_x)), used + n
    return old, new, d.verdict == "rollback", used


def drifting_release(rng, n: int, a, slo: SLO, cand_x: float, mode: str) -> bool:
    """One release on a machine that drifts (True: rolled back). The machine is `a.drift_days` slower
    than when the stable baseline was recorded, and slows by `a.drift_within` more from the start of
    the release's load to its end (both sides' requests count as time). mode: `recorded` (the
    candidate against the baseline of an earlier day), `ab` (stable measured live after the
    candidate), `abba` (live, interleaved by validation.interleave.measure as a release does)."""
    from validation import interleave

    total = n if mode == "recorded" else 2 * n
    sent = {"n": 0}

    def run(side: str, k: int, *_: object) -> dict:
        t = (sent["n"] + np.arange(k)) / total
        sent["n"] += k
        x = (1 + a.drift_days) * (1 + a.drift_within * t) * (cand_x if side == "candidate" else 1.0)
        b = draw(rng, k, a, x, x)
        return {**b, "requests_total": k, "goodput_requests": k, "wall_s": 1.0}

    if mode == "recorded":
        stable, cand = draw(rng, n, a), run("candidate", n)
    else:
        cand, stable = interleave.measure(lambda side, k, _d, _w, _b: run(side, k), n, None, 0,
                                          4 if mode == "abba" else 1)
    return gate.decide(COMPAT, [cand], slo, [stable]).verdict == "rollback"


def drift_table(a, slo: SLO, rng) -> None:
    print(f"\n# machine drift: {a.drift_days:.0%} slower than when the baseline was recorded, "
          f"+{a.drift_within:.0%} more over the release's load; new gate (confidence {a.confidence}); "
          f"{a.releases} releases per cell")
    print("# rollback rate: recorded baseline / live C-then-S / live interleaved C S S C (4 blocks)")
    print("| scenario | " + " | ".join(f"N={n}" for n in a.requests) + " |")
    print("| --- |" + " --- |" * len(a.requests))
    for name, x in (("A/A (false rollback)", 1.0), ("TTFT+ITL +15%", 1.15), ("TTFT+ITL +25%", 1.25)):
        cells = []
        for n in a.requests:
            rates = [np.mean([drifting_release(rng, n, a, slo, x, m) for _ in range(a.releases)])
                     for m in ("recorded", "ab", "abba")]
            cells.append(" / ".join(f"{r:.1%}" for r in rates))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def through_fake(k: int, a) -> None:
    """K releases through the known-timing fake with jitter and the real harness: same gate path."""
    from tests.fakes.known_timing_server import KnownTimingServer
    from validation import profiles
    from validation.bench import run_bench

    slo = SLO(kv_transfer="ignored", client_health="ignored",
              vs_stable=VsStable(ttft_p90=a.factor, tpot_p90=a.factor, itl_p90=a.factor))
    for i in range(k):
        x = 1.0 + (REGRESSIONS[2] if i % 2 else 0.0)
        runs = []
        for scale, seed in ((1.0, 2 * i), (x, 2 * i + 1)):
            srv = KnownTimingServer(first_token_delay=a.ttft_ms / 1000 * scale, inter_token_delay=a.itl_ms / 1000,
                                    tokens=a.tokens, ttft_spread=a.ttft_spread, itl_spread=a.itl_spread,
                                    gap_spread=a.gap_spread, jitter_seed=seed)
            with srv:
                runs.append(run_bench(srv.base_url, srv.model, profiles.get("balanced"), concurrency=8,
                                      requests=a.fake_requests, seed=seed))
        d = gate.decide(COMPAT, [runs[1]], slo, [runs[0]])
        vs = [c for c in d.checks if c.check.startswith("vs_stable")]
        print(f"fake release {i + 1}: candidate TTFT x{x:.2f}, {a.fake_requests} requests each -> {d.verdict}")
        for c in vs:
            print(f"    {c.check}: {c.verdict}: {c.message[:160]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[16, 128, 200, 500],
                    help="requests per side: local overlay 16, Argo bench step 128, dev/staging 200, prod 500")
    ap.add_argument("--releases", type=int, default=400, help="simulated releases per cell")
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--ttft-spread", type=float, default=0.3, help="sigma of log TTFT")
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--itl-spread", type=float, default=0.15, help="sigma of a request's log decode speed")
    ap.add_argument("--gap-spread", type=float, default=0.3, help="sigma of each log ITL gap within a request")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--factor", type=float, default=1.1, help="vs_stable factor (prod overlay: 1.1)")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--looks", type=int, default=3, help="max_looks of the extend policy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--through-fake", type=int, default=0, help="first run this many releases through the fake")
    ap.add_argument("--fake-requests", type=int, default=64)
    ap.add_argument("--drift-days", type=float, default=0.0,
                    help="with --drift-within: also print recorded vs live stable on a drifting machine")
    ap.add_argument("--drift-within", type=float, default=0.0, help="slow-down over one release's load")
    ap.add_argument("--only-drift", action="store_true", help="print only the drift table")
    a = ap.parse_args()
    if a.through_fake:
        through_fake(a.through_fake, a)
    if a.releases <= 0:
        return 0
    vs = VsStable(ttft_p90=a.factor, tpot_p90=a.factor, itl_p90=a.factor)
    base = dict(kv_transfer="ignored", client_health="ignored", vs_stable=vs)
    slo_old = SLO(**base)
    slo_new = SLO(**base, statistics=Statistics(confidence=a.confidence))
    slo_ext = SLO(**base, statistics=Statistics(confidence=a.confidence, inconclusive="extend", max_looks=a.looks))
    rng = np.random.default_rng(a.seed)
    if a.only_drift:
        drift_table(a, slo_new, rng)
        return 0
    scen = [("A/A (false rollback)", 1.0, 1.0)] + [(f"TTFT +{r:.0%}", 1 + r, 1.0) for r in REGRESSIONS] + \
        [(f"ITL +{r:.0%}", 1.0, 1 + r) for r in REGRESSIONS]
    print(f"# {a.releases} releases per cell; vs_stable factor {a.factor} on TTFT, TPOT, ITL p90; confidence "
          f"{a.confidence}; TTFT {a.ttft_ms} ms x lognormal(0, {a.ttft_spread}); ITL {a.itl_ms} ms x lognormal(0, "
          f"{a.itl_spread}) per request x lognormal(0, {a.gap_spread}) per gap, {a.tokens} tokens; seed {a.seed}")
    print("# rollback rate: old (p90 ratio) / new (interval, inconclusive fails) / new (extend, up to "
          f"{a.looks} looks; mean requests per side used)")
    print("| scenario | " + " | ".join(f"N={n}: old / new / extend (N used)" for n in a.requests) + " |")
    print("| --- |" + " --- |" * len(a.requests))
    t0 = time.time()
    for name, tx, ix in scen:
        cells = []
        for n in a.requests:
            res = np.array([release(rng, n, a, slo_old, slo_new, slo_ext, tx, ix) for _ in range(a.releases)])
            cells.append(f"{res[:, 0].mean():.1%} / {res[:, 1].mean():.1%} / {res[:, 2].mean():.1%} "
                         f"({res[:, 3].mean():.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if a.drift_days or a.drift_within:
        drift_table(a, slo_new, rng)
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
