"""A load generator whose event loop stalls in chosen runs, as one blocked by a neighbour on its CPU would.

Each run of the load summarizes its client's health once (validation/loadgen.py `summarize_health`, in the
forked worker with `isolate`). For the runs numbered in `stalled` (1-based, in the order they end), that
summary gets lag samples 100 times the limit added to the ones the run measured, so it is judged as usual
and comes out void. What is emulated: only the stall; the requests, the timing and the judgement are real.
The count lives in a file, since the runs end in forked processes.
"""
from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pytest


def starve(monkeypatch: pytest.MonkeyPatch, folder: Path, stalled: Collection[int]) -> Path:
    """Stall the client in the runs numbered `stalled`; returns the file with one line per run so far."""
    from validation import loadgen

    runs, real = folder / "client-runs", loadgen.summarize_health

    def summarize(lags_ms: list[float], cpu: list[float], machine: dict | None = None) -> dict:
        with runs.open("a") as f:
            f.write("run\n")
        n = len(runs.read_text().splitlines())
        stall = [loadgen.LAG_P99_LIMIT_MS * 100] * max(1, len(lags_ms)) if n in stalled else []
        return real([*lags_ms, *stall], cpu, machine)

    monkeypatch.setattr(loadgen, "summarize_health", summarize)
    return runs
