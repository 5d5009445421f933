#!/usr/bin/env python
"""Benchmark (prints figures, not a test): `pdops release` on the real local stack.

  cold     a fresh PDOPS_HOME: tiny model build, reference engine, Ray start, candidate, validation
  warm     Ray up and a stable release serving: a changed release (new candidate beside stable)
  memory   peak used memory of the whole machine during each release, above the idle baseline
  phases   client TTFT/ITL/TPOT and the server histograms of the prefill and the decode engines
  P/D vs single engine   the same load against one plain vLLM engine of the same model, and the
           golden-token equality the release checked

Figures from the tiny CPU model show the pipeline's costs on this machine, not production speed.
Usage: .venv/bin/python scripts/bench_release.py [--port-base 9500]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class PeakMemory:
    def __init__(self) -> None:
        self.baseline = psutil.virtual_memory().used
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, psutil.virtual_memory().used)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def release(env: dict, overlay: Path) -> tuple[dict, float, PeakMemory]:
    started = time.monotonic()
    with PeakMemory() as mem:
        proc = subprocess.run([sys.executable, "-m", "workflows.cli.main", "release", "--overlay", str(overlay), "--json"],
                              env=env, cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - started
    if not proc.stdout.strip():
        sys.exit(f"release produced no result (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), took, mem


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def q(d: dict | None, key: str) -> str:
    v = (d or {}).get(key)
    return "-" if v is None else f"{v:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-base", type=int, default=9500)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="pdops-bench-"))
    env = {**os.environ, "PDOPS_HOME": str(home), "PDOPS_LOCAL_PORT": str(args.port_base)}
    repo = home / "repo"                       # a changed release for the warm run
    shutil.copytree(ROOT / "kustomize", repo / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", repo / "overlays" / "local")
    spec_file = repo / "overlays" / "local" / "release.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    spec["prefill"]["max_ongoing_requests"] = 48
    spec_file.write_text(yaml.safe_dump(spec))
    try:
        print(f"load before: {os.getloadavg()}; memory used {gib(psutil.virtual_memory().used)}", flush=True)
        cold, cold_s, cold_mem = release(env, ROOT / "overlays" / "local")
        print(f"cold release: {cold['verdict']} in {cold_s:.0f}s, peak memory +{gib(cold_mem.peak - cold_mem.baseline)} "
              f"(machine peak {gib(cold_mem.peak)})", flush=True)
        warm, warm_s, warm_mem = release(env, repo / "overlays" / "local")
        print(f"warm release: {warm['verdict']} in {warm_s:.0f}s, peak memory +{gib(warm_mem.peak - warm_mem.baseline)} "
              f"(machine peak {gib(warm_mem.peak)}, both slots up)", flush=True)

        run = ROOT / warm["run"]
        bench = json.loads(next(run.glob("bench-0-*.json")).read_text())
        print("\nper phase, warm release (ms)            p50      p90      p99")
        for key, label in (("ttft_ms", "client TTFT (prefill + KV + 1st token)"), ("itl_ms", "client ITL"),
                           ("tpot_ms", "client TPOT")):
            print(f"  {label:38} {q(bench[key], 'p50'):>7}  {q(bench[key], 'p90'):>7}  {q(bench[key], 'p99'):>7}")
        for phase, hists in ((bench.get("server") or {}).get("phases") or {}).items():
            for name, h in sorted(hists.items()):
                if h.get("count"):
                    print(f"  server {phase:7} {name:30} {q(h, 'p50_ms'):>7}  {q(h, 'p90_ms'):>7}  {q(h, 'p99_ms'):>7}"
                          f"  (n={h['count']:.0f})")
        kv = (bench.get("server") or {}).get("kv") or {}
        print(f"  KV: {kv.get('external_kv_prompt_tokens', 0):.0f} prompt tokens arrived by NIXL, "
              f"{kv.get('nixl_failed_transfers', 0):.0f} failed transfers")

        from validation import profiles
        from validation.bench import BenchConfig, run_bench
        from workflows.targets.local_stack import Ports, ReferenceEngine

        load = spec["validation"]["load"][0]
        golden = json.loads((run / "golden.json").read_text())
        model_dir = next((home / "models").iterdir())
        with ReferenceEngine(home / "bench", Ports.from_base(args.port_base).reference, str(model_dir), "pdops-tiny",
                             {"enforce_eager": True, "max_model_len": 1024}) as ref:
            ref.wait_ready(lambda m: None)
            single = run_bench(BenchConfig(ref.base_url, "pdops-tiny", profiles.get(load["profile"]),
                                           concurrency=load["concurrency"], requests=load["requests"],
                                           warmup=load["warmup_requests"])).json_data()   # read like the run's bench JSON
        print(f"\nP/D vs single engine, {load['profile']} c={load['concurrency']} x{load['requests']} (client, ms)")
        print("                      TTFT p50  TTFT p90  TPOT p50  TPOT p90")
        for label, b in (("Ray Serve LLM P/D", bench), ("single vLLM engine", single)):
            print(f"  {label:18} {q(b['ttft_ms'], 'p50'):>9} {q(b['ttft_ms'], 'p90'):>9} "
                  f"{q(b['tpot_ms'], 'p50'):>9} {q(b['tpot_ms'], 'p90'):>9}")
        print(f"  golden tokens: {golden['matched']}/{golden['prompts']} prompts equal, {golden['tokens_compared']} tokens")
    finally:
        subprocess.run([sys.executable, "-m", "workflows.cli.main", "down"], env=env, cwd=ROOT, capture_output=True)
        print(f"\n(PDOPS_HOME {home} kept for its logs; run folders under runs/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
