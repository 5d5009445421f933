#!/usr/bin/env python
"""Benchmark (prints figures, not a test): the harness's mean TTFT error vs truth against the
known-timing fake server, at concurrency 1, 16, 64, 256. The server runs in its own process on
127.0.0.1; both sides stamp with time.perf_counter (CLOCK_MONOTONIC on Linux, shared by processes).

  error vs configured = measured TTFT - configured first-token delay (what peers' tables report;
                        includes the fake server's own scheduling lateness)
  read lag            = client read time of first content - server write time of it (harness only)
  send->receipt       = server receipt of the request - client send stamp (harness and network)
  server late         = server write of first content - receipt - configured delay (the fake)

The machine's load averages are printed with each level: figures taken under load are not
comparable (re-run when the 1-minute load is above the core count).

Usage: .venv/bin/python scripts/bench_harness.py [--levels 1,16,64,256] [--workers 2] [--server-procs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation import metrics  # noqa: E402
from validation.loadgen import LoadSpec, run, run_workers  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--first-token-delay", type=float, default=0.1)
    ap.add_argument("--inter-token-delay", type=float, default=0.02)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="client processes (validation.loadgen.run_workers)")
    ap.add_argument("--server-procs", type=int, default=2, help="fake server processes on one SO_REUSEPORT port")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="requests per slot: requests = rounds * concurrency")
    a = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.known_timing_server",
                             "--first-token-delay", str(a.first_token_delay),
                             "--inter-token-delay", str(a.inter_token_delay), "--tokens", str(a.tokens),
                             "--tokens-per-chunk", str(a.tokens_per_chunk), "--procs", str(a.server_procs)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        port = int(proc.stdout.readline())
        own_ports = proc.stdout.readline().split()
        base = f"http://127.0.0.1:{port}/v1"
        truth_ms = a.first_token_delay * 1000
        print(f"known-timing server: first token {truth_ms:.0f} ms, inter-token {a.inter_token_delay * 1000:.0f} ms, "
              f"{a.tokens} tokens, {a.tokens_per_chunk} per chunk; early role chunk on; client workers {a.workers}; "
              f"server processes {a.server_procs}")
        print("| concurrency | requests | TTFT mean ms | error vs configured ms | read lag mean ms | read lag p99 ms "
              "| send->receipt ms | server late ms | ITL mean ms (truth) | loop lag p99 ms | CPU % | bottleneck | load avg 1/5/15 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in [int(x) for x in a.levels.split(",")]:
            n = max(8, a.rounds * c)
            runner = (lambda sp: run_workers(sp, a.workers)) if a.workers > 1 else run
            res = runner(LoadSpec(base, "fake-model",
                               lambda i: {"messages": [{"role": "user", "content": f"bench {i}"}],
                                          "max_tokens": a.tokens},
                               concurrency=c, requests=n, warmup=2, timeout=120))
            m = metrics.compute(res["records"], res["wall_s"])
            truth = {}
            for p in own_ports:
                truth.update(json.loads(urllib.request.urlopen(f"http://127.0.0.1:{p}/_timings").read()))
            lags, itl_true, to_server, late = [], [], [], []
            for r in res["records"]:
                t = truth.get(r.get("response_id") or "")
                if t and t["content"] and r["first_content"] is not None:
                    lags.append((r["first_content"] + res["t0"] - t["content"][0]) * 1000)
                    to_server.append((t["received"] - r["sent"] - res["t0"]) * 1000)
                    late.append((t["content"][0] - t["received"]) * 1000 - truth_ms)
                    itl_true += [(y - x) * 1000 for x, y in zip(t["content"], t["content"][1:])]
            lag = metrics.summary(lags)
            ch = res["client_health"]
            itl_t = sum(itl_true) / len(itl_true) if itl_true else float("nan")
            print(f"| {c} | {m['requests_ok']}/{n} | {m['ttft_ms']['mean']:.1f} | {m['ttft_ms']['mean'] - truth_ms:+.1f} "
                  f"| {lag['mean']:+.1f} | {lag['p99']:+.1f} | {metrics.summary(to_server)['mean']:+.1f} "
                  f"| {metrics.summary(late)['mean']:+.1f} | {m['itl_ms']['mean']:.1f} ({itl_t:.1f}) "
                  f"| {ch['loop_lag_ms']['p99']:.1f} | {ch['cpu_percent']['mean']:.0f} | "
                  f"{'yes' if ch['client_bottleneck'] else 'no'} | {'/'.join(f'{x:.2f}' for x in os.getloadavg())} |",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
