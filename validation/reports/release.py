"""The run folder of `pdops release` / `pdops validate`: RUN/report.json (RunReport: the gate's
decision with the compat and bench reports it judged), RUN/release.json (ReleaseOutcome: how the
release ended) and RUN/golden.json (GoldenReport: P/D tokens vs one plain engine's).

report.json is also read back: the next release's `vs_stable` compares against its `benches`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from validation.reports.base import ReportModel
from validation.reports.bench import BenchReport
from validation.reports.compat import CompatReport
from validation.reports.decision import Decision

ReleaseVerdict = Literal["blocked", "unchanged", "failed", "promote", "rollback"]


class GoldenCase(ReportModel):
    prompt: int
    ok: bool
    tokens: int | None = None               # tokens compared (absent when the answer had none)
    problem: str | None = None              # a failed request or an answer without token ids
    first_difference: int | None = None     # index of the first differing token
    reference: list[int] | None = None      # up to 8 tokens from there, each side
    candidate: list[int] | None = None


class GoldenReport(ReportModel):
    kind: Literal["golden"] = "golden"
    ok: bool
    prompts: int
    matched: int
    tokens_compared: int
    cases: list[GoldenCase] = Field(default_factory=list)


class ReportFiles(ReportModel):
    """Where validation/report.py wrote the run's report."""

    json_path: str = Field(alias="json")
    markdown: str
    plots: list[str] = Field(default_factory=list)


class RunReport(ReportModel):
    """RUN/report.json. Per-request samples stay in `benches` (bounded by validation.metrics)."""

    kind: Literal["run"] = "run"
    verdict: Literal["promote", "rollback"]
    decision: Decision
    compat: CompatReport | None = None
    benches: list[BenchReport] = Field(default_factory=list)


class ReleaseOutcome(ReportModel):
    """RUN/release.json, and what `pdops release --json` prints. Fields after `target` exist once the
    release got that far (a blocked release has no digest)."""

    kind: Literal["release"] = "release"
    overlay: str
    run: str
    target: str
    verdict: ReleaseVerdict | None = None    # null only while the release runs
    reasons: list[str] = Field(default_factory=list)
    seconds: float | None = None
    release: str | None = None               # name@digest prefix (ReleaseRecord.short)
    digest: str | None = None
    revision: str | None = None
    report: ReportFiles | None = None
    checks_failed: int | None = None
    checks_passed: int | None = None
    action: str | None = None                # what the rollback (or restore) did
