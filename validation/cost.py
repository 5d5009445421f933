"""What a benchmark run costs: $ per million input and output tokens and per 1,000 requests,
per phase and in total, from the run's measured throughput and the nodes the release holds.

    phase $/hour           = phase nodes x the instance type's on-demand hourly price
    phase nodes            = worker pods x (1 when a pod takes its node, else pod GPUs / instance GPUs)
    $ per million tokens   = $/hour / (measured tokens per second x 3600) x 1,000,000
    $ per 1,000 requests   = $/hour / (measured successful requests per second x 3600) x 1,000
    total                  = the sum of the phases' $/hour over the same measured throughput

Tokens are the server's usage counts (prompt_tokens, completion_tokens) of successful requests
over the run's wall time; the run is the release's whole throughput, so every phase is charged
for the same tokens. The CPU head pod on the system node group is not priced. Prices come from
workflows/data/prices.yaml (region, date, source in the file) overridden by the spec's `cost`:
that side, which reads the release, is workflows/pipeline/pricing.py (validation/ imports nothing of workflows/).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from validation.reports.bench import BenchReport
from validation.reports.cost import Cost, PhaseCost, Rates, Throughput
from validation.reports.decision import Check

PHASES = ("prefill", "decode")   # the same two as workflows/render/serve_config.py PHASES
FORMULA = "phase nodes x $/hour / (measured tokens/s x 3600) x 1e6; per 1,000 requests likewise"


def _per(usd_per_hour: float, per_second: float, unit: float) -> float | None:
    return usd_per_hour / (per_second * 3600) * unit if per_second > 0 else None


def _rates(usd_per_hour: float, tput: Throughput) -> dict[str, float | None]:
    return {"usd_per_hour": usd_per_hour,
            "usd_per_million_input_tokens": _per(usd_per_hour, tput.input_tokens_per_s or 0, 1e6),
            "usd_per_million_output_tokens": _per(usd_per_hour, tput.output_tokens_per_s or 0, 1e6),
            "usd_per_1k_requests": _per(usd_per_hour, tput.requests_per_s or 0, 1e3)}


def cost_of(bench: BenchReport | dict[str, Any], nodes: dict[str, tuple[str, float]],
            price: Callable[[str], tuple[float | None, str]], phases: Sequence[str] = PHASES) -> Cost:
    """The run's cost from typed inputs: `nodes` maps a phase to (instance type, nodes it holds),
    `price` an instance type to (USD per hour or None, where it comes from / why not). The release's
    side (which nodes, which prices) is workflows/pipeline/pricing.py. A null per-unit figure: that
    throughput was zero; Cost.missing says so."""
    b = BenchReport.coerce(bench)
    tput = Throughput(input_tokens_per_s=b.input_token_throughput_tps or 0.0,
                      output_tokens_per_s=b.output_token_throughput_tps or 0.0,
                      requests_per_s=b.request_throughput_rps or 0.0, wall_s=b.wall_s or 0.0)
    missing = [n for n in phases if n not in nodes]
    if missing:
        return Cost(formula=FORMULA, throughput=tput, priced=False,
                    reason=f"{', '.join(missing)} not pinned to an instance type "
                    "(node.kubernetes.io/instance-type): nothing to price")
    total = 0.0
    by_phase: dict[str, PhaseCost] = {}
    for name in phases:
        it, count = nodes[name]
        usd, source = price(it)
        if usd is None:
            return Cost(formula=FORMULA, throughput=tput, priced=False, reason=source)
        by_phase[name] = PhaseCost.model_validate({"instance_type": it, "nodes": count, "usd_per_node_hour": usd,
                                                   "price_source": source, **_rates(count * usd, tput)})
        total += count * usd
    return Cost(formula=FORMULA, throughput=tput, phases=by_phase, priced=True,
                total=Rates.model_validate(_rates(total, tput)))


def _per_1k(b: BenchReport) -> float | None:
    return b.cost.total.usd_per_1k_requests if b.cost is not None and b.cost.total is not None else None


def vs_stable_cost(candidate: BenchReport, stable: BenchReport, factor: float,
                   label: str) -> Check:
    """The gate's `vs_stable.cost` check: candidate $ per 1,000 requests <= factor x stable's."""
    c, s = _per_1k(candidate), _per_1k(stable)
    if c is None or not s:
        return Check(check="vs_stable_cost", ok=False, message=f"{label}: $ per 1,000 requests cannot be compared "
                     f"(candidate {c}, stable {s}): both runs need priced instance types", bench=label, limit=factor)
    r = c / s
    return Check(check="vs_stable_cost", ok=r <= factor, message=f"{label}: ${c:.4f} per 1,000 requests is {r:.2f}x "
                 f"stable ${s:.4f} (limit {factor}x)", bench=label, value=r, limit=factor)


def markdown_lines(labels_and_benches: list[tuple[str, BenchReport]]) -> list[str]:
    """The report's cost table: total and per phase, for each priced run."""
    rows: list[tuple[str, str, Rates]] = [
        (lab, name, p) for lab, b in labels_and_benches if b.cost is not None and b.cost.priced
        and b.cost.total is not None for name, p in [*b.cost.phases.items(), ("total", b.cost.total)]]
    if not rows:
        return []
    f = lambda v, spec: "-" if v is None else format(v, spec)   # noqa: E731
    lines = ["## Cost (on-demand, validation/cost.py)", "", FORMULA + ".", "",
             "| run | phase | nodes | $/hour | $/M input tokens | $/M output tokens | $/1k requests |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for lab, name, p in rows:
        nodes = p.nodes if isinstance(p, PhaseCost) else None
        lines.append(f"| {lab} | {name} | {f(nodes, 'g')} | {p.usd_per_hour:.2f} | "
                     f"{f(p.usd_per_million_input_tokens, '.2f')} | {f(p.usd_per_million_output_tokens, '.2f')} | "
                     f"{f(p.usd_per_1k_requests, '.3f')} |")
    return lines + [""]
