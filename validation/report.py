"""Reports: JSON, a Markdown summary and PNG plots (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from validation.gate import bench_label, itl_source
from validation.reports.bench import BenchReport, Quantiles
from validation.reports.compat import CompatReport
from validation.reports.decision import Decision
from validation.reports.release import ReportFiles, RunReport
from validation.server_metrics import side_by_side

MISSING_SHOWN = 6   # null figures explained per run in summary.md


def _fmt(v: object) -> str:
    return "–" if v is None else (f"{v:.1f}" if isinstance(v, float) and abs(v) >= 10 else
                                  f"{v:.2f}" if isinstance(v, float) else str(v))


def _g(summary: Quantiles | None, q: str) -> str:
    return _fmt(getattr(summary, q) if summary is not None else None)


def _bench_lines(benches: list[BenchReport]) -> list[str]:
    """The benchmarks table, what was not measured and why, and client vs server latency."""
    lines = ["## Benchmarks (ms)", "",
             "| run | ok | err | TTFT p50 | TTFT p90 | TTFT p99 | ITL p90 | ITL p99 | TPOT p90 | TPOT p99 "
             "| tokens/chunk "
             "| prompt tokens served/requested | goodput req/s | client |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for i, b in enumerate(benches):
        ch = "BOTTLENECK" if b.client_health.client_bottleneck else "ok"
        chunk = " (chunk)" if b.itl_level == "chunk" else ""
        if chunk:
            notes.append(f"- {bench_label(b, i)}: ITL (chunk) is the gap between streamed chunks, not between "
                         f"tokens; the gate used {itl_source(b)[1]}.")
        ratio = b.lengths.prompt_ratio_mean if b.lengths is not None else None
        lines.append(f"| {bench_label(b, i)} | {_fmt(b.requests_ok)} | {_fmt(b.errors)} | {_g(b.ttft_ms, 'p50')} | "
                     f"{_g(b.ttft_ms, 'p90')} | {_g(b.ttft_ms, 'p99')} | {_g(b.itl_ms, 'p90')}{chunk} | "
                     f"{_g(b.itl_ms, 'p99')}{chunk} | {_g(b.tpot_ms, 'p90')} | {_g(b.tpot_ms, 'p99')} | "
                     f"{_g(b.tokens_per_chunk, 'mean')} | {_fmt(ratio)} | "
                     f"{_fmt(b.goodput_rps)} | {ch} |")
    lines += [""] + notes + ([""] if notes else [])
    why = []
    for i, b in enumerate(benches):   # the first few per run; the bench JSON's `missing` has them all
        items = list(b.missing.items())
        why += [f"- {bench_label(b, i)}: `{path}` is null: {reason}" for path, reason in items[:MISSING_SHOWN]]
        if len(items) > MISSING_SHOWN:
            why.append(f"- {bench_label(b, i)}: {len(items) - MISSING_SHOWN} more in its JSON's `missing`")
    if why:   # docs/reports.md: a missing figure is null with a reason, shown here instead of a 0
        lines += ["Not measured (– above):", "", *why, ""]
    sbs = [(bench_label(b, i), r) for i, b in enumerate(benches) for r in side_by_side(b)]
    if sbs:
        lines += ["## Client vs server (ms)", "",
                  "Server figures are the run's histogram deltas (quantiles interpolated inside buckets); "
                  "client minus server is the client and network overhead.", "",
                  "| run | phase | client p50 | server p50 | client p90 | server p90 | client p99 | server p99 "
                  "| server metric |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for lab, r in sbs:
            lines.append(f"| {lab} | {r['phase']} | " + " | ".join(
                f"{_fmt(r[f'client_{q}'])} | {_fmt(r[f'server_{q}'])}" for q in ("p50", "p90", "p99"))
                + f" | {r['metric']} |")
        lines.append("")
    return lines


def _check_lines(decision: Decision) -> list[str]:
    """Every check of the gate, with its verdict and message."""
    lines = ["## Checks", "",
             "Latency checks with per-request samples state their interval, its confidence and the smallest "
             "effect the run could detect (validation/verdicts.py); `point` = judged on the point estimate.", "",
             "| check | run | ok | verdict | message |", "| --- | --- | --- | --- | --- |"]
    for chk in decision.checks:
        v = chk.verdict or ("point" if chk.limit is not None and chk.check.endswith(("_ms", "_p90")) else "")
        lines.append(f"| {chk.check} | {chk.bench or ''} | {'✔' if chk.ok else '✘'} | {v} | "
                     f"{chk.message.replace('|', '/')} |")
    return lines


def markdown(decision: Decision, compat: CompatReport | None, benches: list[BenchReport]) -> str:
    lines = [f"# Validation: **{decision.verdict.upper()}**", ""]
    lines += ["## Reasons", ""] + [f"- {r}" for r in decision.reasons] + [""]
    if benches:
        lines += _bench_lines(benches)
    from validation.cost import markdown_lines  # $ per run, when the runs were priced
    lines += markdown_lines([(bench_label(b, i), b) for i, b in enumerate(benches)])
    from validation.balance import markdown_lines as balance_lines  # which phase queued, per run
    lines += balance_lines([(bench_label(b, i), b) for i, b in enumerate(benches)])
    if decision.advice:   # pdops advise on these runs (workflows/pipeline/advise_patch.py)
        lines += ["## Advice (phase balance)", ""] + [f"- {a}" for a in decision.advice] + [""]
    if compat:
        lines += ["## Compatibility", "", "| case | status | required | detail |", "| --- | --- | --- | --- |"]
        for c in compat.cases:
            lines.append(f"| {c.name} | {c.status} | {'yes' if c.required else 'no'} | "
                         f"{c.detail.replace('|', '/')[:120]} |")
        lines.append("")
    lines += _check_lines(decision)
    return "\n".join(lines) + "\n"


def _cdf(ax: Any, vals: list[float], label: str) -> None:
    v = sorted(vals)
    if not v:
        return
    ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)


def _save(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plots(benches: list[BenchReport], out: Path) -> list[Path]:
    files = []
    for metric, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")):
        if not any(b.samples is not None and getattr(b.samples, metric) for b in benches):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, b in enumerate(benches):
            _cdf(ax, (getattr(b.samples, metric) if b.samples is not None else None) or [], bench_label(b, i))
        files.append(_save(fig, ax, f"{title} (ms)", "fraction of samples", f"{title} CDF",
                      out / f"{metric}_cdf.png"))
    # latency vs load, per profile, when several load levels
    by_profile: dict[str, list[BenchReport]] = {}
    for b in benches:
        by_profile.setdefault(b.profile or "?", []).append(b)
    for prof, bs in by_profile.items():
        if len(bs) < 2:
            continue
        xs = [b.load.concurrency or b.load.rate or 0 for b in bs]
        order = sorted(range(len(bs)), key=lambda i: xs[i])
        fig, ax = plt.subplots(figsize=(6, 4))
        for metric, q in (("ttft_ms", "p90"), ("ttft_ms", "p99"), ("tpot_ms", "p90"), ("itl_ms", "p90")):
            ax.plot([xs[i] for i in order], [getattr(getattr(bs[i], metric) or Quantiles(), q) for i in order],
                    marker="o", label=f"{metric[:-3].upper()} {q}")
        files.append(_save(fig, ax, "load (concurrency or req/s)", "ms", f"latency vs load: {prof}",
                      out / f"latency_vs_load_{prof}.png"))
    return files


def write(out: Path | str, decision: Decision, compat: CompatReport | dict[str, Any] | None,
          benches: list[BenchReport] | list[dict[str, Any]]) -> ReportFiles:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    typed_compat = CompatReport.coerce(compat) if compat is not None else None
    typed = [BenchReport.coerce(b) for b in benches]
    # per-request samples stay in the report (bounded by validation.metrics.MAX_SAMPLE_REQUESTS): the
    # next release reads this file as its stable side and compares distributions, not two p90s
    run = RunReport(verdict=decision.verdict, decision=decision, compat=typed_compat, benches=typed)
    run.write(out / "report.json")
    (out / "summary.md").write_text(markdown(decision, typed_compat, typed))
    pngs = plots(typed, out)
    return ReportFiles.model_validate({"json": str(out / "report.json"), "markdown": str(out / "summary.md"),
                                       "plots": [str(p) for p in pngs]})
