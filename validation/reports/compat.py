"""CompatReport: what `pdops compat` (validation/compat.py) finds, case by case.

Written to RUN/compat.json by a release and to `--json FILE` by `pdops compat`; the gate reads
`required_failures` (or, in older reports, the failed required cases).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from validation.reports.base import ReportModel

Status = Literal["pass", "fail", "skip"]


class CompatCase(ReportModel):
    name: str
    status: Status
    required: bool = True             # False: listed in release.yaml validation.compat.optional
    detail: str = ""                  # why it failed or was skipped
    duration_s: float | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)   # requests and answers the case looked at


class CompatReport(ReportModel):
    kind: Literal["compat"] = "compat"
    base_url: str | None = None
    model: str | None = None
    cases: list[CompatCase] = Field(default_factory=list)
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None
    required_failures: list[str] | None = None   # None in a hand-written report: derived from `cases`
    ok: bool | None = None

    @classmethod
    def of(cls, base_url: str, model: str, cases: list[CompatCase]) -> CompatReport:
        req = [c.name for c in cases if c.status == "fail" and c.required]
        return cls(base_url=base_url, model=model, cases=cases,
                   passed=sum(c.status == "pass" for c in cases), failed=sum(c.status == "fail" for c in cases),
                   skipped=sum(c.status == "skip" for c in cases), required_failures=req, ok=not req)

    def blocking(self) -> list[str]:
        """Required cases that failed."""
        if self.required_failures is not None:
            return list(self.required_failures)
        return [c.name for c in self.cases if c.status == "fail" and c.required]
