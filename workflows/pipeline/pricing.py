"""The release's side of a run's cost: which instance types and how many nodes each phase holds
(from the rendered worker groups) and their on-demand prices (workflows/data/prices.yaml,
overridden by release.yaml `cost`). validation/cost.py turns them and the run's measured
throughput into $ per million tokens and per 1,000 requests.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from validation.cost import cost_of
from validation.release_inputs import ReleaseInputs
from validation.reports.bench import BenchReport
from validation.reports.cost import Cost
from workflows.checks.instances import phase_instances, takes_node
from workflows.errors import InputError
from workflows.render.manifest import Rendered, render
from workflows.render.rendered import RenderedRelease
from workflows.render.serve_config import PHASES
from workflows.spec.release import ReleaseSpec, load_spec

PRICES = Path(__file__).resolve().parents[1] / "data" / "prices.yaml"


@functools.lru_cache(maxsize=1)
def pinned_prices() -> dict[str, Any]:
    return yaml.safe_load(PRICES.read_text(encoding="utf-8"))


def price_of(instance: str, spec: ReleaseSpec) -> tuple[float | None, str]:
    """(USD per hour, where it comes from) for an instance type in the spec's region."""
    if instance in spec.cost.prices:
        return spec.cost.prices[instance], "release.yaml cost.prices"
    table = pinned_prices()
    region = spec.cost.region or table["region"]
    row = table["prices"].get(instance)
    if region != table["region"] or row is None:
        return None, f"no pinned price for {instance} in {region}: set cost.prices.{instance} in release.yaml"
    flag = " (unverified)" if row.get("unverified") else ""
    return float(row["usd_per_hour"]), f"prices.yaml {table['region']} {table['pinned']} [{row['source']}]{flag}"


def phase_nodes(rendered: Rendered) -> dict[str, tuple[str, float]]:
    """Phase -> (instance type, nodes it holds) from the rendered worker groups."""
    out = {}
    for name, (group, it_name, it) in phase_instances(RenderedRelease.of(rendered)).items():
        pods = int(group.raw.get("replicas") or group.raw.get("minReplicas") or 1)
        share = 1.0 if it is None or takes_node(group, it) else min(1.0, group.gpus / it.gpus)
        out[name] = (it_name, pods * share)
    return out


def bench_cost(bench: BenchReport | dict[str, Any], spec: ReleaseSpec, rendered: Rendered) -> Cost:
    """The run's cost on the release's nodes at the spec's prices (validation/cost.py cost_of)."""
    return cost_of(bench, phase_nodes(rendered), lambda instance: price_of(instance, spec), PHASES)


def add_costs(benches: list[BenchReport], overlay: Path) -> str | None:
    """Price benches that carry no `cost` yet (`pdops gate` on runs of `pdops bench`) on the overlay's
    nodes. Returns why nothing was priced, or None."""
    todo = [b for b in benches if b.cost is None]
    if not todo:
        return None
    try:
        rendered = render(Path(overlay), validate_serve_config=False)
    except InputError as exc:
        return f"runs not priced: {exc.render()}"
    assert rendered.spec is not None
    for b in todo:
        b.cost = bench_cost(b, rendered.spec, rendered)
    return None


def release_inputs(release: Path) -> ReleaseInputs:
    """What `pdops gate` / `pdops plan-load --release` read of RELEASE (validation/cli.py ReleaseInputs):
    its slo and validation sections, and pricing runs on its overlay's nodes."""
    spec = load_spec(release.parent)
    return ReleaseInputs(slo=spec.slo, validation=spec.validation,
                         price=lambda benches: add_costs(benches, release.parent))
