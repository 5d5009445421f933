"""Typed reports: what compat, bench, diff, the gate and a release write (docs/reports.md).

Producers build these models and write their JSON; consumers read attributes. The JSON Schemas in
validation/schemas/ are generated from them (`pdops schema`)."""
from validation.diff.models import Report as DiffReport
from validation.reports.bench import BenchReport, ClientHealth, Quantiles, ServerMetrics
from validation.reports.compat import CompatCase, CompatReport
from validation.reports.cost import Cost
from validation.reports.decision import Check, Decision
from validation.reports.release import GoldenReport, ReleaseOutcome, ReportFiles, RunReport

__all__ = ["BenchReport", "Check", "ClientHealth", "CompatCase", "CompatReport", "Cost", "Decision", "DiffReport",
           "GoldenReport", "Quantiles", "ReleaseOutcome", "ReportFiles", "RunReport", "ServerMetrics"]
