#!/usr/bin/env python
"""Benchmark (prints figures, not a test): wall time of `pdops check OVERLAY` as a person runs it,
one fresh process per run, for every overlay.

  no cache  PDOPS_NO_CACHE=1: every run imports Ray Serve LLM's models (how check behaved before the cache)
  cold      an empty cache (first check after an install or a Ray/vLLM upgrade)
  warm      the same overlay again (median of --repeat runs): the pre-commit / editor loop
  edited    warm, after an edit that leaves the serve config alone (a label in the overlay's
            kustomization): kustomize runs again, Ray's verdict is still cached

The machine's load average is printed: wall times taken while other work runs are not comparable
(re-run when the 1-minute load is below the core count). `warm cpu` is the CPU time (user + system)
of a warm check, which other work on the machine hardly changes.

Usage: .venv/bin/python scripts/bench_check.py [--repeat 3] [--overlays local,prod] [--warm-only]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(overlay: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `pdops check` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workflows.cli.main", "check", str(overlay)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"check {overlay} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per overlay (the median is printed)")
    ap.add_argument("--overlays", help="comma-separated names (default: every overlay)")
    ap.add_argument("--warm-only", action="store_true", help="fill the cache once, then time warm and edited only")
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
    print(f"{'overlay':<9}{'no cache':>10}{'cold':>9}{'warm':>9}{'warm cpu':>10}{'edited':>9}   load")
    try:
        for name in names:
            overlay = work / "repo" / "overlays" / name
            cache_env = {**env, "PDOPS_CACHE_DIR": str(work / f"cache-{name}")}
            uncached = "-" if args.warm_only else f"{check(overlay, {**env, 'PDOPS_NO_CACHE': '1'})[0]:.2f}s"
            cold = f"{check(overlay, cache_env)[0]:.2f}s"
            cold = "-" if args.warm_only else cold
            runs = [check(overlay, cache_env) for _ in range(args.repeat)]
            warm, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            kustomization = overlay / "kustomization.yaml"
            kustomization.write_text(kustomization.read_text() + "commonAnnotations:\n  pdops.dev/bench: edited\n")
            edited = check(overlay, cache_env)[0]
            print(f"{name:<9}{uncached:>10}{cold:>9}{warm:>8.2f}s{cpu:>9.2f}s{edited:>8.2f}s   {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
