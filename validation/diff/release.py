"""`pdops diff` inside a release: what workflows/steps.py calls, and what the gate and report read.

    report = for_release(candidate_url, reference_url, spec, release_file, run_dir, progress)
    gate.decide(..., diff=report)        # the `diff` check: no unexpected divergence

The matrix, the release's `validation.scenarios` and its `validation.known_divergences` run
against the target's single-engine reference; the report lands in RUN/diff.json and a Markdown
table in RUN/diff.md.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from validation.diff.command import diff
from validation.diff.models import Report
from validation.diff.scenarios import spec_files


def for_release(candidate_url: str, reference_url: str, spec: Any, release_file: str | Path, run: Path,
                progress: Callable[[str], None], api_key: str | None = None) -> Report:
    """Run the suite for a release; returns the report (also written to RUN/diff.json)."""
    scenario_paths, known_path = spec_files(spec.validation, release_file)
    report = diff(candidate_url, reference_url, spec.model.id, scenario_files=[str(p) for p in scenario_paths],
                  known_file=str(known_path) if known_path else None, api_key=api_key,
                  timeout=spec.validation.request_timeout_s, progress=progress)
    (Path(run) / "diff.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
    (Path(run) / "diff.md").write_text(markdown(report), encoding="utf-8")
    return report


def gate_check(report: Report | dict[str, Any]) -> tuple[bool, str]:
    """(ok, message) of the gate's `diff` check."""
    r = report if isinstance(report, Report) else Report.model_validate(report)
    s = r.summary
    bad = [c for c in r.cases if c.outcome in ("differs", "error")]
    msg = (f"P/D vs single engine: {s.same} same, {s.known} known, {s.differs} differ, "
           f"{s.error} error of {s.cases} cases")
    msg += "".join(f"; {c.name}: {c.detail[:160]}" for c in bad[:3])
    if s.known_not_reproduced:
        msg += f"; known but no longer reproducing (remove them): {', '.join(s.known_not_reproduced)}"
    return s.ok, msg


def markdown(report: Report) -> str:
    s = report.summary
    lines = ["# P/D vs single engine (`pdops diff`)", "",
             f"{s.cases} cases in {s.seconds:.0f} s: **{s.same} same, {s.known} known, "
             f"{s.differs} differ, {s.error} error**. Candidate {s.base_url}, reference {s.reference_url}.",
             "", "| case | api | outcome | detail |", "| --- | --- | --- | --- |"]
    for c in report.cases:
        if c.outcome == "same":
            continue
        detail = (f"known: {c.known.reason} ([link]({c.known.link}))" if c.known is not None
                  else c.detail).replace("|", "\\|")
        lines.append(f"| {c.name} | {c.api} | {c.outcome} | {detail[:300]} |")
    for name in s.known_not_reproduced:
        lines.append(f"\nKnown divergence `{name}` no longer reproduces: remove it from the known file.")
    return "\n".join(lines) + "\n"
