"""Reports: JSON, a Markdown summary and PNG plots (matplotlib, Agg backend)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from validation.gate import bench_label, itl_source  # noqa: E402
from validation.server_metrics import side_by_side  # noqa: E402


def _fmt(v) -> str:
    return "–" if v is None else (f"{v:.1f}" if isinstance(v, float) and abs(v) >= 10 else
                                  f"{v:.2f}" if isinstance(v, float) else str(v))


def markdown(decision: dict, compat: dict | None, benches: list[dict]) -> str:
    lines = [f"# Validation: **{decision['verdict'].upper()}**", ""]
    lines += ["## Reasons", ""] + [f"- {r}" for r in decision["reasons"]] + [""]
    if benches:
        lines += ["## Benchmarks (ms)", "",
                  "| run | ok | err | TTFT p50 | TTFT p90 | TTFT p99 | ITL p90 | ITL p99 | TPOT p90 | TPOT p99 | tokens/chunk "
                  "| prompt tokens served/requested | goodput req/s | client |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        notes = []
        for i, b in enumerate(benches):
            g = lambda m, q: _fmt((b.get(m) or {}).get(q))  # noqa: E731
            ch = "BOTTLENECK" if (b.get("client_health") or {}).get("client_bottleneck") else "ok"
            chunk = " (chunk)" if b.get("itl_level") == "chunk" else ""
            if chunk:
                notes.append(f"- {bench_label(b, i)}: ITL (chunk) is the gap between streamed chunks, not between "
                             f"tokens; the gate used {itl_source(b)[1]}.")
            lines.append(f"| {bench_label(b, i)} | {b.get('requests_ok')} | {b.get('errors')} | {g('ttft_ms', 'p50')} | "
                         f"{g('ttft_ms', 'p90')} | {g('ttft_ms', 'p99')} | {g('itl_ms', 'p90')}{chunk} | "
                         f"{g('itl_ms', 'p99')}{chunk} | {g('tpot_ms', 'p90')} | {g('tpot_ms', 'p99')} | "
                         f"{g('tokens_per_chunk', 'mean')} | {g('lengths', 'prompt_ratio_mean')} | "
                         f"{_fmt(b.get('goodput_rps'))} | {ch} |")
        lines += [""] + notes + ([""] if notes else [])
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
    from validation.cost import markdown_lines   # $ per run, when the runs were priced
    lines += markdown_lines([(bench_label(b, i), b) for i, b in enumerate(benches)])
    from validation.balance import markdown_lines as balance_lines   # which phase queued, per run
    lines += balance_lines([(bench_label(b, i), b) for i, b in enumerate(benches)])
    if decision.get("advice"):   # pdops advise on these runs (workflows/advise_patch.py)
        lines += ["## Advice (phase balance)", ""] + [f"- {a}" for a in decision["advice"]] + [""]
    if compat:
        lines += ["## Compatibility", "", "| case | status | required | detail |", "| --- | --- | --- | --- |"]
        for c in compat.get("cases", []):
            lines.append(f"| {c['name']} | {c['status']} | {'yes' if c.get('required', True) else 'no'} | "
                         f"{c.get('detail', '').replace('|', '/')[:120]} |")
        lines.append("")
    lines += ["## Checks", "",
              "Latency checks with per-request samples state their interval, its confidence and the smallest "
              "effect the run could detect (validation/verdicts.py); `point` = judged on the point estimate.", "",
              "| check | run | ok | verdict | message |", "| --- | --- | --- | --- | --- |"]
    for c in decision["checks"]:
        v = c.get("verdict") or ("point" if c.get("limit") is not None and c["check"].endswith(("_ms", "_p90")) else "")
        lines.append(f"| {c['check']} | {c.get('bench') or ''} | {'✔' if c['ok'] else '✘'} | {v} | "
                     f"{c['message'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _cdf(ax, vals, label):
    v = sorted(vals)
    if not v:
        return
    ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)



def _save(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

def plots(benches: list[dict], out: Path) -> list[Path]:
    files = []
    for metric, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")):
        if not any((b.get("samples") or {}).get(metric) for b in benches):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, b in enumerate(benches):
            _cdf(ax, (b.get("samples") or {}).get(metric, []), bench_label(b, i))
        files.append(_save(fig, ax, f"{title} (ms)", "fraction of samples", f"{title} CDF",
                      out / f"{metric}_cdf.png"))
    # latency vs load, per profile, when several load levels
    by_profile: dict[str, list[dict]] = {}
    for b in benches:
        by_profile.setdefault(b.get("profile", "?"), []).append(b)
    for prof, bs in by_profile.items():
        if len(bs) < 2:
            continue
        xs = [(b.get("load") or {}).get("concurrency") or (b.get("load") or {}).get("rate") or 0 for b in bs]
        order = sorted(range(len(bs)), key=lambda i: xs[i])
        fig, ax = plt.subplots(figsize=(6, 4))
        for metric, q in (("ttft_ms", "p90"), ("ttft_ms", "p99"), ("tpot_ms", "p90"), ("itl_ms", "p90")):
            ax.plot([xs[i] for i in order], [(bs[i].get(metric) or {}).get(q) for i in order], marker="o",
                    label=f"{metric[:-3].upper()} {q}")
        files.append(_save(fig, ax, "load (concurrency or req/s)", "ms", f"latency vs load: {prof}",
                      out / f"latency_vs_load_{prof}.png"))
    return files


def write(out: Path | str, decision: dict, compat: dict | None, benches: list[dict]) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # per-request samples stay in the report (bounded by validation.metrics.MAX_SAMPLE_REQUESTS): the
    # next release reads this file as its stable side and compares distributions, not two p90s
    report = {"verdict": decision["verdict"], "decision": decision, "compat": compat, "benches": benches}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "summary.md").write_text(markdown(decision, compat, benches))
    pngs = plots(benches, out)
    return {"json": str(out / "report.json"), "markdown": str(out / "summary.md"), "plots": [str(p) for p in pngs]}
