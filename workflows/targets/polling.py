"""How long a wait sleeps between looks: soon at first, then every `poll_s`.

A release waits on things that are often already done or done in a moment (a Service that switched
at once, a reference RayService whose finalizer KubeRay removed a second after the delete, Serve
dropping an application) and on things that take minutes (engines starting). A fixed 5 s poll
loses up to 5 s on every short wait: 4-6 of them per release on Kubernetes. The schedule here is
client-go's exponential backoff (k8s.io/apimachinery/pkg/util/wait `Backoff`: Duration, Factor,
Cap; `Step` returns the current duration and multiplies the next by Factor, capped at Cap) without
Steps or Jitter: 0.25, 0.5, 1, 2, 4 s, then every `poll_s`. A wait of minutes asks the API server
four times more than before, in its first 8 s.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

FIRST_S = 0.25   # the first look after the first check
FACTOR = 2.0


def delays(poll_s: float, first_s: float = FIRST_S) -> Iterator[float]:
    """Endless sleeps of an exponential backoff from `first_s` (at most `poll_s`) capped at `poll_s`."""
    delay = min(first_s, poll_s)
    while True:
        yield delay
        delay = min(delay * FACTOR, poll_s)


class Poll:
    """`sleep()` once per look of one wait: `for` loops that are `while` loops keep their shape."""

    def __init__(self, poll_s: float) -> None:
        self._delays = delays(poll_s)

    def sleep(self) -> None:
        time.sleep(next(self._delays))
