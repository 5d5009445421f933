"""The gate's `diff` check on a `pdops diff` report: no unexpected divergence (validation/gate.py).

Kept apart from the command and the runner so the gate imports only the report's model.
"""
from __future__ import annotations

from typing import Any

from validation.diff.models import Report


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
