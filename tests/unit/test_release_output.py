"""What a person reads during a release: rounded numbers, and no output from libraries.

Before: `[bench] done: ok=16 errors=0 TTFT p50=329.268342999967 p99=708.0113132999259`, and the
tokenizers trainer's progress bars (drawn only on a terminal) when the release built the tiny model.
"""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

from tests.conftest import ROOT
from tests.fakes.known_timing_server import KnownTimingServer
from validation import compat, profiles
from validation.bench import BenchConfig, run_bench

LONG_FLOAT = re.compile(r"\d+\.\d{3,}")


def test_bench_and_compat_progress_lines_carry_rounded_numbers():
    lines: list[str] = []
    with KnownTimingServer(first_token_delay=0.0123456, inter_token_delay=0.001, tokens=4, model="m") as srv:
        run_bench(BenchConfig(srv.base_url, "m", profiles.custom(16, 4), concurrency=2, requests=4, progress=lines.append))
        compat.run(srv.base_url, "m", progress=lines.append, only=["models_list", "chat_nonstream_shape"])
    assert lines and not [line for line in lines if LONG_FLOAT.search(line)], lines
    assert "[bench] custom-16-4: concurrency 2, 4 requests" in lines
    done = next(line for line in lines if line.startswith("[bench] done"))
    assert re.fullmatch(r"\[bench\] done: 4 ok, 0 errors, TTFT p50 \d+(\.\d)? ms p99 \d+(\.\d)? ms", done), done


def test_building_the_tiny_model_on_a_terminal_prints_only_our_lines(tmp_path):
    """On a pseudo-terminal, where the tokenizers trainer would draw its bars."""
    env = {**os.environ, "PDOPS_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "workflows.cli.main", "tiny-model"], cwd=ROOT, env=env,
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:   # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=600) == 0
    lines = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n").split("\n")
    built = next(tmp_path.glob("models/pdops-tiny-*"))
    assert lines == ["building tiny model pdops-tiny (about 10 s)...", str(built), ""], lines


# ---- the client's own health: isolated, prioritized, and honest about the machine -------------------

def test_release_bench_runs_the_client_in_its_own_process_at_a_higher_priority():
    """steps passes isolate=True: a forked client at loadgen.CLIENT_NICE where the OS permits it."""
    from validation import loadgen

    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.001, tokens=4, model="m") as srv:
        bench = run_bench(BenchConfig(srv.base_url, "m", profiles.custom(16, 4), concurrency=2, requests=4, isolate=True))
    assert bench.requests_ok == 4
    machine = bench.client_health.machine
    permitted = os.geteuid() == 0   # CAP_SYS_NICE
    assert machine.client_nice == (loadgen.CLIENT_NICE if permitted else os.getpriority(os.PRIO_PROCESS, 0))
    assert os.getpriority(os.PRIO_PROCESS, 0) != loadgen.CLIENT_NICE   # the caller kept its own
    assert machine.cores == os.cpu_count() and machine.load_avg_1m >= 0


def test_a_starved_client_on_an_oversubscribed_machine_says_why_its_figures_cannot_be_trusted(monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", -1.0)          # every run counts as starved
    monkeypatch.setattr("validation.loadgen.os.getloadavg", lambda: (14.2, 9.0, 5.0))
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.001, tokens=4, model="m") as srv:
        bench = run_bench(BenchConfig(srv.base_url, "m", profiles.custom(16, 4), concurrency=2, requests=4, isolate=True))
    health = bench.client_health
    assert health.client_bottleneck
    why = [r for r in health.reasons if "oversubscribed" in r]
    assert why and f"load 14.2 on {os.cpu_count()} cores" in why[0] and "cannot be trusted" in why[0]


def test_a_starved_client_on_an_idle_machine_is_not_blamed_on_the_machine():
    from validation.loadgen import summarize_health

    idle = {"cores": 2, "load_avg_1m": 0.5, "system_cpu_percent": 20.0, "client_nice": 0}
    health = summarize_health([0.1] * 90 + [50.0] * 10, [10.0], idle)
    assert health["client_bottleneck"] and not [r for r in health["reasons"] if "oversubscribed" in r]
