"""What the target commands share (`pdops release ...` in release_cli.py, `pdops validate` in
validate_cli.py): the progress printer, the result printer and the API key the endpoints want.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable


def progress(started: float) -> Callable[[str], None]:
    """A printer of progress lines to stderr, each stamped with the minutes:seconds since `started`."""
    def say(msg: str) -> None:
        m, s = divmod(int(time.monotonic() - started), 60)
        print(f"[{m:02d}:{s:02d}] {msg}", file=sys.stderr, flush=True)
    return say


def emit(args: argparse.Namespace, data: dict, text: str) -> None:
    """The result on stdout: JSON with --json, else the readable text."""
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        print()
    else:
        print(text)


def api_key() -> str | None:
    """The API key sent to the served endpoint (PDOPS_API_KEY), None when unset or empty."""
    return os.environ.get("PDOPS_API_KEY") or None
