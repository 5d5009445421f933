"""Your own traffic: a trace of requests (arrival time, prompt and output lengths) replayed as a load.

Formats read (`format: auto` tells them apart by the file's first record):
- `mooncake`: Mooncake's JSONL (kvcache-ai/Mooncake FAST'25 traces; also what aiperf and Dynamo replay):
  `{"timestamp": ms since the first request, "input_length": N, "output_length": M, "hash_ids": [...]}`.
  `hash_ids` (shared prompt prefixes) are not reproduced: prompts are made fresh per request.
- `azure`: the Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024): CSV with the
  columns `TIMESTAMP` (a date-time), `ContextTokens`, `GeneratedTokens`.
- `jsonl`: plain JSONL, one request a line: `{"arrival_s": s, "prompt_tokens": N, "output_tokens": M}`.
Replay: arrival times are shifted so the first request is at 0 and divided by `time_scale`
(2 = twice as fast), at most `max_requests` are kept, and each request's latency is also measured
from its scheduled arrival (open loop: queueing in the client cannot hide overload).
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from validation.errors import InputError

FORMATS = ("auto", "mooncake", "azure", "jsonl")
MAX_TOKENS = 1_000_000          # a length beyond this is a damaged trace, not a request


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Trace:
    name: str
    requests: tuple[TraceRequest, ...]

    @property
    def arrivals(self) -> list[float]:
        return [r.arrival_s for r in self.requests]

    def lengths(self, i: int) -> tuple[int, int]:
        r = self.requests[i % len(self.requests)]   # warm-up indexes (negative) reuse the trace's lengths
        return r.prompt_tokens, r.output_tokens


def _length(value: object, file: Path, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(file, f"{where}: {field}", f"expected a token count, got {value!r}")
    try:
        n = int(float(value))
    except ValueError:
        raise InputError(file, f"{where}: {field}", f"expected a token count, got {value!r}") from None
    if not 1 <= n <= MAX_TOKENS:
        raise InputError(file, f"{where}: {field}", f"{n} is outside 1..{MAX_TOKENS}")
    return n


def _detect(file: Path, first: str) -> str:
    if first.lstrip().startswith("{"):
        keys = json.loads(first)
        return "mooncake" if "input_length" in keys else "jsonl"
    if "ContextTokens" in first:
        return "azure"
    raise InputError(file, "line 1", "not a trace this reader knows",
                     f"use one of {', '.join(FORMATS[1:])} (docs/adoption.md#your-own-traffic)")


def _rows(file: Path, fmt: str) -> list[tuple[float, int, int]]:
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines:
        raise InputError(file, "", "the trace is empty")
    fmt = _detect(file, lines[0]) if fmt == "auto" else fmt
    out: list[tuple[float, int, int]] = []
    if fmt == "azure":
        reader = csv.DictReader(lines)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or [])
        if missing:
            raise InputError(file, "header", f"an Azure trace needs the columns {sorted(missing)}")
        for n, row in enumerate(reader, start=2):
            try:
                ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]).timestamp()
            except ValueError:
                raise InputError(file, f"line {n}: TIMESTAMP", f"not a date-time: {row['TIMESTAMP']!r}") from None
            out.append((ts, _length(row["ContextTokens"], file, f"line {n}", "ContextTokens"),
                        _length(row["GeneratedTokens"], file, f"line {n}", "GeneratedTokens")))
        return out
    keys = {"mooncake": ("timestamp", "input_length", "output_length", 1e-3),
            "jsonl": ("arrival_s", "prompt_tokens", "output_tokens", 1.0)}[fmt]
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise InputError(file, f"line {n}", f"not JSON: {exc}") from None
        if not isinstance(rec, dict) or keys[0] not in rec:
            raise InputError(file, f"line {n}", f"a {fmt} record needs {keys[0]!r}, {keys[1]!r} and {keys[2]!r}")
        t = rec[keys[0]]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or t < 0:
            raise InputError(file, f"line {n}: {keys[0]}", f"expected a time >= 0, got {t!r}")
        out.append((float(t) * keys[3], _length(rec.get(keys[1]), file, f"line {n}", keys[1]),
                    _length(rec.get(keys[2]), file, f"line {n}", keys[2])))
    return out


def load(file: str | Path, fmt: str = "auto", time_scale: float = 1.0, max_requests: int | None = None) -> Trace:
    """A trace ready to replay: sorted by arrival, first at 0, scaled, capped."""
    path = Path(file)
    if fmt not in FORMATS:
        raise InputError(path, "format", f"unknown trace format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputError(path, "", "no such trace file", "give a path inside the repository, relative to the overlay")
    rows = sorted(_rows(path, fmt))
    if not rows:
        raise InputError(path, "", "the trace holds no requests")
    t0 = rows[0][0]
    kept = rows[:max_requests] if max_requests else rows
    return Trace(path.name, tuple(TraceRequest((t - t0) / time_scale, p, o) for t, p, o in kept))

