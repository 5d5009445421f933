"""Peak memory of a step command, as a pod's memory limit sees it (the step image's cold cache).

A step pod's HOME is a fresh emptyDir (workflows/argo/definitions.py `_volumes`, HOME=/tmp), so every step runs
with a cold cache (workflows/render/cache.py): this runs the command with HOME and XDG_CACHE_HOME in a new
empty folder, samples the resident memory of its whole process tree (pdops and the kubectl/kustomize
it starts) every 20 ms, and prints the peak, the limit the steps carry (workflows/argo/definitions.py
STEP_MEMORY) and the headroom. A report: it exits 1 only when the peak exceeds the limit.

    .venv/bin/python scripts/step_memory.py                      # pdops render overlays/prod (default)
    .venv/bin/python scripts/step_memory.py -- pdops check overlays/prod
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def _quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def peak_rss(command: list[str], env: dict[str, str], every_s: float = 0.02) -> tuple[int, int, float]:
    """(peak RSS of the process tree in bytes, exit code, seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        except psutil.NoSuchProcess:
            break
        peak = max(peak, total)
        time.sleep(every_s)
    proc.wait()
    return peak, proc.returncode, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="*", help="the step command (default: pdops render overlays/prod)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from workflows.argo.definitions import STEP_MEMORY

    pdops = [sys.executable, "-m", "workflows.cli.main"]
    command = args.command or ["pdops", "render", "overlays/prod", "-o", os.devnull]
    if command[0] == "pdops":
        command = pdops + command[1:]
    with tempfile.TemporaryDirectory(prefix="pdops-step-home-") as home:
        env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": str(Path(home) / ".cache"), "PYTHONPATH": str(ROOT)}
        peak, code, took = peak_rss(command, env)
    limit = _quantity(STEP_MEMORY)
    print(f"command: {' '.join(args.command or ['pdops', 'render', 'overlays/prod'])} (cold cache: fresh HOME)")
    print(f"exit {code} in {took:.1f}s; peak RSS of the process tree {peak / MIB:.0f} MiB")
    print(f"step memory limit {STEP_MEMORY} = {limit / MIB:.0f} MiB; headroom {(limit - peak) / MIB:.0f} MiB "
          f"({(limit - peak) / limit:.0%})")
    return 1 if peak > limit else 0


if __name__ == "__main__":
    sys.exit(main())
