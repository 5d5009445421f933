#!/usr/bin/env python
"""Benchmark (prints figures, not a test): wall time of `pdops check OVERLAY` as a person runs it,
one fresh process per run, for every overlay.

  no cache  PDOPS_NO_CACHE=1: every run imports Ray Serve LLM's models (how check behaved before the cache)
  cold      an empty cache (first check after an install or a Ray/vLLM upgrade)
  warm      the same overlay again (median of --repeat runs): the pre-commit / editor loop
  edited    warm, after an edit that leaves the serve config alone (a label in the overlay's
            kustomization): kustomize runs again, Ray's verdict is still cached

The machine's load average is printed: figures taken while other work runs are not comparable
(re-run when the 1-minute load is below the core count).

Usage: .venv/bin/python scripts/bench_check.py [--repeat 3] [--overlays local,prod]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(overlay: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workflows.cli", "check", str(overlay)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"check {overlay} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per overlay (the median is printed)")
    ap.add_argument("--overlays", help="comma-separated names (default: every overlay)")
    args = ap.parse_args()
    names = args.overlays.split(",") if args.overlays else sorted(
        p.name for p in (ROOT / "overlays").iterdir() if (p / "kustomization.yaml").exists())
    work = Path(tempfile.mkdtemp(prefix="pdops-bench-check-"))
    # A copy of the repository's kustomize tree and overlays, so `edited` can change a file.
    shutil.copytree(ROOT / "kustomize", work / "repo" / "kustomize")
    shutil.copytree(ROOT / "overlays", work / "repo" / "overlays")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PDOPS_NO_CACHE", None)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'overlay':<9}{'no cache':>10}{'cold':>9}{'warm':>9}{'edited':>9}   load")
    try:
        for name in names:
            overlay = work / "repo" / "overlays" / name
            cache_env = {**env, "PDOPS_CACHE_DIR": str(work / f"cache-{name}")}
            uncached = check(overlay, {**env, "PDOPS_NO_CACHE": "1"})
            cold = check(overlay, cache_env)
            warm = statistics.median(check(overlay, cache_env) for _ in range(args.repeat))
            kustomization = overlay / "kustomization.yaml"
            kustomization.write_text(kustomization.read_text() + "commonAnnotations:\n  pdops.dev/bench: edited\n")
            edited = check(overlay, cache_env)
            print(f"{name:<9}{uncached:>9.2f}s{cold:>8.2f}s{warm:>8.2f}s{edited:>8.2f}s   {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
