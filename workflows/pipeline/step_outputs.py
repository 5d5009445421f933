"""What a step hands to Argo: one file per output parameter, read by Argo's `valueFrom.path`.

Runs inside the step pods (the Argo definitions are in workflows/argo/definitions.py). Every step that can end
a run writes `verdict` and `summary`, so the workflow's outputs and Prometheus metrics say why a run
ended however early it ended: `blocked` (check found problems), `failed` (the target or validation
could not finish), `dry-run`, `unchanged` (rollout: the release already serves as stable, so the
workflow skips validate and promote), `promote` / `rollback` (the gate's verdict), `rolled-back`
(a run asked only to roll back). The last writer wins: Argo keeps the newest value of a global output
(`addOutputsToGlobalScope` in workflow/controller/operator.go), and the DAG is a chain.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from validation.reports.bench import BenchReport, Quantiles

VERDICTS = ("checked", "blocked", "pending", "dry-run", "unchanged", "promote", "rollback", "failed", "rolled-back")
# Headline figures of the first benchmark; the workflow's gauges (argo.GAUGES) read them.
FIGURES = ("ttft-p50-ms", "ttft-p99-ms", "itl-p50-ms", "itl-p99-ms", "kv-prompt-tokens")
SUMMARY_MAX = 200_000   # bytes: Argo stores output parameters in the Workflow object (etcd's 1.5 MiB limit)


def figures(benches: Sequence[BenchReport | dict[str, Any]] | None) -> dict[str, str]:
    """The first bench's headline latencies and KV tokens; NaN where it has none (never a fake 0)."""
    from validation.reports.bench import BenchReport

    bench = BenchReport.coerce(benches[0]) if benches else None

    def num(value: float | None) -> str:
        return f"{float(value):g}" if value is not None and math.isfinite(value) else "NaN"

    def q(summary: Quantiles | None, p: str) -> str:
        return num(getattr(summary, p) if summary is not None else None)

    kv = bench.server.kv if bench is not None and bench.server is not None else None
    return {"ttft-p50-ms": q(bench.ttft_ms if bench else None, "p50"),
            "ttft-p99-ms": q(bench.ttft_ms if bench else None, "p99"),
            "itl-p50-ms": q(bench.itl_ms if bench else None, "p50"),
            "itl-p99-ms": q(bench.itl_ms if bench else None, "p99"),
            "kv-prompt-tokens": num(kv.external_kv_prompt_tokens if kv is not None else None)}


def write(out: str | Path | None, verdict: str, summary: str,
          benches: Sequence[BenchReport | dict[str, Any]] | None = None) -> None:
    """Write `verdict`, `summary` (and with `benches`, the figures) under `out`; no-op without `out`."""
    if out is None:
        return
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "verdict").write_text(verdict, encoding="utf-8")
    text = summary if len(summary.encode()) <= SUMMARY_MAX else summary.encode()[:SUMMARY_MAX].decode(errors="ignore")
    (folder / "summary").write_text(text, encoding="utf-8")
    if benches is not None:
        for name, value in figures(benches).items():
            (folder / name).write_text(value, encoding="utf-8")


def lines(title: str, reasons: list[str]) -> str:
    """A short Markdown summary: what ended the step and why."""
    return "\n".join([f"# {title}", "", *(f"- {r}" for r in reasons)]) + "\n"
