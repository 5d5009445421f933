"""Node status and the clock of one run (pkg/apis/workflow/v1alpha1/workflow_types.go NodeStatus)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

FULFILLED = ("Succeeded", "Failed", "Error", "Skipped", "Omitted")


@dataclass
class Node:
    name: str                    # Argo's node name: <workflow>.<task>, retries <...>(N)
    template: str
    phase: str = "Pending"
    message: str = ""
    started: float = 0.0         # run clock seconds
    finished: float = 0.0
    params: dict[str, str] = field(default_factory=dict)           # outputs.parameters
    globals: dict[str, str] = field(default_factory=dict)          # output parameter name -> globalName
    artifacts: dict[str, Path] = field(default_factory=dict)       # outputs.artifacts (host copies)
    exit_code: str | None = None
    has_outputs: bool = False    # Argo: node.Outputs != nil (skipped nodes have none)
    attempts: list[Node] = field(default_factory=list)           # retry children
    log: str = ""

    @property
    def fulfilled(self) -> bool:
        return self.phase in FULFILLED

    @property
    def failed_or_error(self) -> bool:
        return self.phase in ("Failed", "Error")

    @property
    def completed(self) -> bool:  # NodePhase.Completed: skipped/omitted are not
        return self.phase in ("Succeeded", "Failed", "Error")


class Clock:
    """Run time in seconds. Backoff waits are skipped (added, not slept), so a retry's maxDuration and
    backoff are computed exactly as Argo does while the test does not wait 15 s per retry; steps and
    deadlines run in real time. A skip belongs to the thread (the DAG task) that waits: two tasks
    backing off at once wait in parallel, as in Argo."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.waits: list[float] = []

    def now(self) -> float:
        return time.monotonic() - self._t0 + getattr(self._local, "skipped", 0.0)

    def wait(self, seconds: float) -> None:
        self._local.skipped = getattr(self._local, "skipped", 0.0) + max(0.0, seconds)
        with self._lock:
            self.waits.append(seconds)


def parse_duration(text: str) -> float:
    """wfv1.ParseStringToDuration: a bare number is seconds, else Go's time.ParseDuration (s, m, h)."""
    if text.replace(".", "", 1).isdigit():
        return float(text)
    total, num = 0.0, ""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            num += c
            i += 1
            continue
        unit = "ms" if text[i:i + 2] == "ms" else c
        if unit not in units or not num:
            raise ValueError(f"invalid duration {text!r}")
        total += float(num) * units[unit]
        num, i = "", i + len(unit)
    if num:
        raise ValueError(f"invalid duration {text!r}: missing unit")
    return total
