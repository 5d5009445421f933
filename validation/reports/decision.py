"""Decision: the gate's verdict (validation/gate.py `decide`), every check with its value, limit and,
for latency checks judged on samples, its interval, confidence and the smallest detectable effect.

A check whose figure could not be read has `value: null`; its `message` says why (and it fails:
an unproven candidate is not promoted).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from validation.reports.base import ReportModel

Judgement = Literal["pass", "fail", "inconclusive", "skipped"]   # skipped: no reference engine this time (gate.decide)


class Check(ReportModel):
    check: str                        # e.g. ttft_p90_ms, vs_stable_ttft_p90, kv_transfer, compat
    ok: bool
    bench: str | None = None          # the run it is about (bench_label), None for release-wide checks
    # the measured figure: a number, or a list of names (failed compat cases, replaced engines)
    value: int | float | list[str] | None = None
    limit: int | float | str | None = None  # the threshold ("> 0" style limits as text)
    message: str
    # latency checks judged on samples (validation/judge.py): bounds (lower at 1 - alpha, upper at
    # `confidence` = 1 - missed_regression), what the run can detect; absent on the others
    verdict: Judgement | None = None
    interval: list[float | None] | None = None   # one-sided bounds; null = no bound exists (infinite)
    confidence: float | None = None
    detectable: dict[str, float | None] | None = None
    # the share of the decision's false-rollback budget (slo.statistics.false_rollback) this check may
    # fail at (validation/judge.py budget); null on checks that are not a statistical test
    alpha: float | None = None


class Decision(ReportModel):
    kind: Literal["decision"] = "decision"
    verdict: Literal["promote", "rollback"]
    reasons: list[str]
    checks: list[Check] = Field(default_factory=list)
    failed: int = 0
    passed: int = 0
    inconclusive: int = 0
    look: int = 1
    extend: list[int] = Field(default_factory=list)   # benches to run again (slo.statistics: extend)
    # pdops advise on the runs (validation/balance.py, workflows/pipeline/advise_patch.py): report lines, never a gate
    advice: list[str] = Field(default_factory=list)
    # what the decision did NOT test, e.g. "gated on absolute SLOs only: <why no baseline>"
    # (slo.vs_stable.without_baseline: absolute_only); when set it is also the first reason
    scope: str | None = None

    @classmethod
    def of(cls, checks: list[Check], look: int, extend: set[int], scope: str | None = None) -> Decision:
        failed = [c for c in checks if not c.ok]
        return cls(verdict="rollback" if failed else "promote", scope=scope,
                   reasons=([scope] if scope else []) + ([c.message for c in failed] or ["all checks passed"]),
                   checks=checks,
                   failed=len(failed), passed=len(checks) - len(failed),
                   inconclusive=sum(1 for c in checks if c.verdict == "inconclusive"), look=look,
                   extend=sorted(extend) if extend and all(c.verdict == "inconclusive" for c in failed) else [])

    def named(self, name: str) -> list[Check]:
        return [c for c in self.checks if c.check == name]

