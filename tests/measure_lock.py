"""One latency-gated measurement at a time on this machine, across test processes.

The Argo tier's pipeline runs validate with the client-health gate on (overlays/dev gates on
`client_health`, docs/gate.md); the e2e tier's releases run the real local stack and measure with their own
client at the same priority (overlays/local ignores client health: its figures are reports). When the two
measure at once on 2 cores, the e2e tier starves the Argo run's client and the gate rightly calls the
measurement void and rolls back: the clean-clone CI at 9cc08b0 (2026-12-06) went red that way
(`test_push_to_dev_releases_the_pushed_revision`: event-loop lag p99 18.7 ms > 10 ms at load 8.6, with the
e2e stack releasing beside it), as did the move of the step image test on 2026-12-06 (lag 52 ms at 8.9).
Timing the tiers so that they happen not to overlap holds only until a tier's length changes; this lock
makes the rule explicit: an Argo-tier `submit` and the whole e2e session each hold it, so `make ci-tiers`
can run the tiers side by side and only their measuring parts take turns.

The lock is an flock on PDOPS_TEST_MEASURE_LOCK (default /var/tmp/pdops-tests-measure.lock: machine-wide, so
two clones or worktrees on one machine take turns too). Within one process it is shared: the first holder
takes the flock, the others (a test's concurrent workflows, in threads) join it, the last to leave releases it.
"""
from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_guard = threading.Lock()
_state: dict = {"holders": 0, "file": None}
WAITED = {"seconds": 0.0}   # this process's total wait, for the tiers' summary lines


def lock_path() -> Path:
    return Path(os.environ.get("PDOPS_TEST_MEASURE_LOCK") or "/var/tmp/pdops-tests-measure.lock")


@contextmanager
def measuring(what: str) -> Iterator[float]:
    """Hold the machine's measuring lock for the block; yields the seconds spent waiting for it."""
    waited = 0.0
    with _guard:
        if _state["holders"] == 0:
            f = open(lock_path(), "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"[measure-lock] {what}: waiting for another test process's measurement ({lock_path()})",
                      file=sys.stderr, flush=True)
                started = time.monotonic()
                fcntl.flock(f, fcntl.LOCK_EX)
                waited = time.monotonic() - started
                WAITED["seconds"] += waited
                print(f"[measure-lock] {what}: got it after {waited:.0f} s", file=sys.stderr, flush=True)
            _state["file"] = f
        _state["holders"] += 1
    try:
        yield waited
    finally:
        with _guard:
            _state["holders"] -= 1
            if _state["holders"] == 0:
                f, _state["file"] = _state["file"], None
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
