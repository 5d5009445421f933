"""What every command line of validation/ shares: argument types (a bad flag is a usage error,
exit 2, before any request is sent), the JSON writer and the stderr printer. Used by
validation/cli.py and validation/diff/command.py; imports no command module.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel

from validation.errors import InputError


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_json(path: str | None, data: BaseModel | dict[str, Any]) -> None:
    """DATA as JSON at PATH (nothing when PATH is None); a report model writes its own strict JSON
    (validation/reports/base.py ReportModel.to_json: NaN as null, field aliases)."""
    if path:
        p = Path(path)
        to_json = getattr(data, "to_json", None)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(to_json() if callable(to_json) else
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
