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
from validation.bench import run_bench

LONG_FLOAT = re.compile(r"\d+\.\d{3,}")


def test_bench_and_compat_progress_lines_carry_rounded_numbers():
    lines: list[str] = []
    with KnownTimingServer(first_token_delay=0.0123456, inter_token_delay=0.001, tokens=4, model="m") as srv:
        run_bench(srv.base_url, "m", profiles.custom(16, 4), concurrency=2, requests=4, progress=lines.append)
        compat.run(srv.base_url, "m", progress=lines.append, only=["models_list", "chat_nonstream_shape"])
    assert lines and not [line for line in lines if LONG_FLOAT.search(line)], lines
    assert "[bench] custom-16-4: concurrency 2, 4 requests" in lines
    done = next(line for line in lines if line.startswith("[bench] done"))
    assert re.fullmatch(r"\[bench\] done: 4 ok, 0 errors, TTFT p50 \d+(\.\d)? ms p99 \d+(\.\d)? ms", done), done


def test_building_the_tiny_model_on_a_terminal_prints_only_our_lines(tmp_path):
    """On a pseudo-terminal, where the tokenizers trainer would draw its bars."""
    env = {**os.environ, "PDOPS_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "workflows.cli", "tiny-model"], cwd=ROOT, env=env,
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
