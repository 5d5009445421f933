"""How busy the load generator's client is, by how fast the server streams: a dev-sized load (the balanced profile,
1,600 requests at concurrency 16) against the known-timing fake at each inter-token delay given, printing the
load's wall time, the client's event-loop lag and CPU, and whether the client health gate would void it.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_client_load.py 0.005 0.02

Why it exists: the Argo tier's fake engines stream at 20 ms per token (tests/argo/scenario.py says why, with the
figures this printed). A report, not a test: the figures depend on the machine and on what else it runs.
"""
from __future__ import annotations

import argparse
import time

from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles
from validation.bench import BenchConfig, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("delays", nargs="+", type=float, help="inter-token delays of the fake, seconds")
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    for delay in args.delays:
        server = KnownTimingServer(first_token_delay=0.02, inter_token_delay=delay, tokens=8, model="fake").start()
        try:
            started = time.monotonic()
            report = run_bench(BenchConfig(server.base_url, server.model, profiles.get("balanced"),
                                           concurrency=args.concurrency, requests=args.requests, seed=0))
            health = report.client_health
            print(f"inter-token {delay * 1000:.0f} ms: {time.monotonic() - started:.1f} s; client event-loop lag "
                  f"p99 {health.loop_lag_ms.p99:.1f} ms, CPU mean {health.cpu_percent.mean:.0f} % "
                  f"(max {health.cpu_percent.max:.0f} %); void: {health.client_bottleneck}", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
