"""The canary's run history and decision across runs (validation/canary.py): reset on a new release,
a retried step recorded once, hard failures at once, a slow drift alarms, an A/A history does not."""
from __future__ import annotations

import math

import numpy as np

from validation import canary
from validation.reports.decision import Check, Decision


def _decision(p90_ms: float, *, errors_ok: bool = True) -> Decision:
    checks = [Check(check="ttft_p90_ms", ok=True, bench="c8-chat", value=p90_ms, limit=900.0, message="ttft"),
              Check(check="vs_stable_ttft_p90", ok=True, bench="c8-chat", value=p90_ms / 300.0, limit=1.1,
                    message="vs"),
              Check(check="error_rate", ok=errors_ok, bench="c8-chat", value=0.0 if errors_ok else 0.2,
                    limit=0.01, message="c8-chat: 20 of 100 requests failed" if not errors_ok else "ok")]
    return Decision.of(checks, 1, set())


def _run(history, release: str, run_id: str, d: Decision):
    history, added = canary.record(history, release, run_id, 0.0, canary.latency_stats(d))
    return history, added, canary.decide(d, history)


def _series(rng: np.random.Generator, n: int, sd: float = 0.04, phi: float = 0.3) -> list[float]:
    e, out = rng.normal(0, sd), []
    for _ in range(n):
        e = phi * e + math.sqrt(1 - phi * phi) * rng.normal(0, sd)
        out.append(300.0 * math.exp(e))
    return out


def test_a_new_release_starts_the_history_again():
    h = None
    for i in range(5):
        h, _, _ = _run(h, "sha256:aaa", f"uid-{i}", _decision(300.0))
    assert h["runs_since_reset"] == 5
    h, added, v = _run(h, "sha256:bbb", "uid-5", _decision(300.0))
    assert added and h["release"] == "sha256:bbb" and h["runs_since_reset"] == 1
    assert [r["run"] for r in h["recent"]] == ["uid-5"] and "1 runs since" in v.lines[0]


def test_a_retried_step_does_not_append_twice():
    h = None
    for i in range(12):
        h, _, _ = _run(h, "sha256:aaa", f"uid-{i}", _decision(300.0 + i))
    again, added, _ = _run(h, "sha256:aaa", "uid-11", _decision(900.0))   # the retry measured something else
    assert not added and again == h and again["runs_since_reset"] == 12


def test_a_hard_failure_acts_at_once_on_the_first_run():
    _, _, v = _run(None, "sha256:aaa", "uid-0", _decision(300.0, errors_ok=False))
    assert v.act and v.hard == ["c8-chat: 20 of 100 requests failed"] and not v.alarms


def test_a_latency_failure_alone_does_not_act_but_a_slow_drift_crosses():
    rng = np.random.default_rng(3)
    h, acted_at = None, None
    calm = _series(rng, 24)
    drift = [x * math.exp(0.01 * i) for i, x in enumerate(_series(rng, 60), 1)]   # +1 % per run
    for i, p90 in enumerate(calm + drift):
        d = _decision(p90)
        h, _, v = _run(h, "sha256:aaa", f"uid-{i}", d)
        if v.act:
            acted_at = i - len(calm) + 1
            break
    assert acted_at is not None and 5 <= acted_at <= 40, acted_at
    assert not v.hard and any("sustained slowdown" in a for a in v.alarms)
    assert any("CUSUM" in line and "/ h" in line for line in v.lines)


def test_an_aa_history_does_not_alarm_in_30_days():
    rng = np.random.default_rng(4)
    h, acted = None, 0
    for i, p90 in enumerate(_series(rng, canary.CanaryDesign().window)):
        h, _, v = _run(h, "sha256:aaa", f"uid-{i}", _decision(p90))
        acted += v.act
    assert acted == 0 and h["runs_since_reset"] == 1440 and len(h["recent"]) == canary.RECENT
    assert "0.0" in v.lines[1] and "per 30 days" in v.lines[1]


def test_the_threshold_spends_the_budget():
    arl = 2 * 1440 / 0.05
    h = canary.threshold(1.0, arl)
    assert abs(canary.siegmund_arl(1.0, h) - arl) / arl < 1e-6


def test_a_latency_failure_of_one_look_waits_for_the_cusum_unless_it_is_gross():
    def failed(value: float) -> Decision:
        return Decision.of([Check(check="itl_p90_ms", ok=False, bench="c8", value=value, limit=60.0,
                                  message=f"c8: itl p90 {value} ms > 60 ms")], 1, set())
    _, _, v = _run(None, "sha256:aaa", "uid-0", failed(75.0))
    assert not v.act and any("not acted on" in line for line in v.lines)
    _, _, v = _run(None, "sha256:aaa", "uid-0", failed(250.0))     # 4x the SLO: pd-canary's Argo-tier regression
    assert v.act and v.hard == ["c8: itl p90 250.0 ms > 60 ms"]
