"""What every report model shares: lenient reading, strict-JSON writing, and the null-with-reason rule.

The rule (docs/reports.md): a figure that was not measured is `null`, never `0`, and the report's
`missing` map says why, keyed by the field's dotted path (`"server"`, `"ttft_ms"`, `"error_rate"`).
A reason on a prefix covers everything under it (`"server"` covers `server.kv.nixl_failed_transfers`).
`explain_nulls` fills a generic reason for any null the producer did not explain, so the rule holds
for every report written, including ones read back from older JSON.

Reports are read back (the gate reads bench JSON from `pdops bench`, a release reads the stable
release's report.json), so models accept what older producers wrote: unknown fields are kept
(extra="allow") and fields default to null or empty.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class ReportModel(BaseModel):
    """Base of every report model: unknown fields survive a read-modify-write round trip."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @classmethod
    def coerce(cls, value: Self | dict[str, Any]) -> Self:
        """A model from itself or from the JSON dict a producer wrote (ValidationError on another shape)."""
        return value if isinstance(value, cls) else cls.model_validate(value)

    def to_json(self) -> str:
        """Strict JSON (NaN and infinities as null, as JSON has neither), indented for people."""
        return self.model_dump_json(indent=2, by_alias=True, fallback=str)

    def write(self, path: Path | str) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    def json_data(self) -> dict[str, Any]:
        """What the written file holds, as Python data (for callers that embed it elsewhere)."""
        data: dict[str, Any] = json.loads(self.to_json())
        return data


def null_paths(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every null leaf (list items as their index)."""
    if data is None:
        return [prefix] if prefix else []
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in null_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in null_paths(v, f"{prefix}.{i}" if prefix else str(i))]
    return []


def covered(path: str, reasons: dict[str, str]) -> bool:
    """A reason for the path or for any prefix of it."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in reasons for i in range(1, len(parts) + 1))


def unexplained(data: dict[str, Any], reasons: dict[str, str], by_design: tuple[str, ...]) -> list[str]:
    """Null leaves with no reason, outside the paths that are null by design (settings, not figures)."""
    return [p for p in null_paths(data)
            if not covered(p, reasons) and not any(p == d or p.startswith(d + ".") for d in by_design)]
