"""`pdops diff` inside a release: what workflows/pipeline/steps.py calls, and what the gate and report read.

    report = for_release(candidate_url, reference_url, model, scenario_files, known_file, timeout, run_dir, progress)
    gate.decide(..., diff=report)        # the `diff` check (validation/diff/verdict.py gate_check)

The matrix, the release's `validation.scenarios` and its `validation.known_divergences` run
against the target's single-engine reference; the report lands in RUN/diff.json and a Markdown
table in RUN/diff.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from validation.diff.command import diff
from validation.diff.models import Report


def for_release(candidate_url: str, reference_url: str, model: str, scenario_files: Sequence[Path],
                known_file: Path | None, timeout: float, run: Path, progress: Callable[[str], None],
                api_key: str | None = None, fields: dict[str, dict[str, set[str]]] | None = None) -> Report:
    """Run the suite for a release; returns the report (also written to RUN/diff.json). The files are
    the release's `validation.scenarios` and `validation.known_divergences`, already resolved and
    checked by the caller (workflows/spec/release.py spec_files: validation/ reads no release spec).
    `fields`: the installed request schemas' fields for the coverage (matrix.schema_fields), when the
    caller has them kept; None reads them from the installed packages."""
    report = diff(candidate_url, reference_url, model, scenario_files=[str(p) for p in scenario_files],
                  known_file=str(known_file) if known_file else None, api_key=api_key,
                  timeout=timeout, progress=progress, fields=fields)
    (Path(run) / "diff.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
    (Path(run) / "diff.md").write_text(markdown(report), encoding="utf-8")
    return report


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
