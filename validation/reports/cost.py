"""Cost of one benchmark run (validation/cost.py `bench_cost`): per phase and in total, from the
run's measured throughput and the nodes the rendered release holds."""
from __future__ import annotations

from pydantic import Field, model_validator

from validation.reports.base import ReportModel, unexplained


class Throughput(ReportModel):
    input_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    wall_s: float | None = None


class Rates(ReportModel):
    """$ figures; a per-unit figure is null when its throughput was zero (nothing to divide by)."""

    usd_per_hour: float
    usd_per_million_input_tokens: float | None = None
    usd_per_million_output_tokens: float | None = None
    usd_per_1k_requests: float | None = None


class PhaseCost(Rates):
    instance_type: str
    nodes: float
    usd_per_node_hour: float
    price_source: str


class Cost(ReportModel):
    formula: str | None = None
    throughput: Throughput = Field(default_factory=Throughput)
    phases: dict[str, PhaseCost] = Field(default_factory=dict)
    priced: bool = False
    reason: str | None = None         # why the run is not priced (priced: false)
    total: Rates | None = None
    missing: dict[str, str] = Field(default_factory=dict)   # dotted path of a null $ figure -> why

    @model_validator(mode="after")
    def _explain(self) -> Cost:
        """Unpriced: `reason` says why, for every $ figure. Priced: a null per-unit figure had no throughput."""
        if not self.priced:
            self.reason = self.reason or "not priced"
            return self
        data = self.model_dump(mode="json", include={"total", "phases"})
        for path in unexplained(data, self.missing, ()):
            unit = path.rsplit(".", 1)[-1]
            self.missing[path] = {"usd_per_1k_requests": "no successful request in the run: no $ per request",
                                  "usd_per_million_input_tokens": "no prompt tokens counted in the run (usage)",
                                  "usd_per_million_output_tokens": "no output tokens counted in the run (usage)",
                                  }.get(unit, "not measured")
        return self
