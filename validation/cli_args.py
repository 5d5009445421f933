"""What every command line of validation/ shares: argument types (a bad flag is a usage error,
exit 2, before any request is sent), the JSON writer and the stderr printer. Used by
validation/cli.py and validation/diff/command.py; imports no command module.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel

from validation.config import SLO, Validation
from validation.errors import InputError
from validation.reports.base import ReportModel
from validation.reports.bench import BenchReport


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_json(path: str | None, data: ReportModel | BaseModel | dict[str, Any]) -> None:
    if path:
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(data.to_json() if isinstance(data, ReportModel) else
                         data.model_dump_json(indent=2) if isinstance(data, BaseModel) else
                         json.dumps(data, indent=2, default=str))
        except OSError as exc:
            raise InputError(p, "", f"cannot write: {exc.strerror}") from None
        err(f"wrote {p}")


def http_url(text: str) -> str:
    url = urlparse(text)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"expected http(s)://HOST[:PORT]/PATH, got {text!r}")
    return text


def number(kind, low: float, low_ok: bool):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not low_ok):
            bound = ">=" if low_ok else ">"
            raise argparse.ArgumentTypeError(f"expected a finite number {bound} {low:g}, got {text!r}")
        return value
    return parse


positive_int, count, positive = number(int, 0, False), number(int, 0, True), number(float, 0, False)
nonnegative = number(float, 0, True)


def output_file(text: str) -> str:
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file to write")
    return text


def output_dir(text: str) -> str:
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    return text


@dataclass(frozen=True)
class ReleaseInputs:
    """What `pdops gate` and `pdops plan-load --release` read of a release.yaml, as typed inputs:
    validation/ imports nothing of workflows/, so the top CLI (workflows/cli.py) hands in the
    reader (workflows/pricing.py release_inputs) through validation/cli.py register(sub, read_release=...)."""
    slo: SLO
    validation: Validation
    price: Callable[[list[BenchReport]], str | None]   # prices runs without a cost; why not, or None


ReleaseReader = Callable[[Path], ReleaseInputs]
