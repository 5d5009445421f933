"""What `pdops gate` and `pdops plan-load --release` read of a release.yaml, as typed inputs.

validation/ imports nothing of workflows/: the reader that builds them from the release spec is
workflows/pipeline/pricing.py release_inputs, handed to validation/cli.py register(sub, read_release=...) by
the top CLI (workflows/cli/main.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from validation.config import SLO, Validation
from validation.reports.bench import BenchReport


@dataclass(frozen=True)
class ReleaseInputs:
    """The release's slo and validation sections, and how to price runs on its overlay's nodes."""
    slo: SLO
    validation: Validation
    price: Callable[[list[BenchReport]], str | None]   # prices runs without a cost; why not, or None


ReleaseReader = Callable[[Path], ReleaseInputs]
