"""What the gate refuses to judge: bench reports whose counts, samples or client health cannot be trusted.

Every fail-open path issue 21 found began with a figure read leniently: `errors: null` read as 0 %,
a summary `error_rate` of 0.0 trusted over 26 failures in 526 requests, one NaN or 0.0 sample making
the gate drop the whole sample list and fall back to point estimates, a report without
`client_health` counted as a healthy client. `problems` lists each such defect with the field it is
in and what to do; `pdops gate` exits 2 on them (naming the file), and `validation.gate.decide`
(called in-process by a release) turns them into a failing `report_input` check. Never a verdict
on figures that are not there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from validation.reports.bench import BenchReport, Quantiles

RERUN = "re-run `pdops bench --json` (it writes requests_total, requests_ok, errors and client_health)"
COUNTS = ("requests_total", "requests_ok", "errors")
# Which per-request samples may be 0. TTFT: never; the first content chunk cannot arrive at the
# instant the request is sent (the known-timing fake answering at once on loopback, 200 requests at
# c=1: smallest TTFT 0.231 ms, median 0.266 ms), so a 0 is a clock or parsing bug. TPOT: never; the
# bench writes null, not 0, when the client saw every token at once (validation/metrics.py
# per_request; the same fake run sent all 8 tokens in one read). ITL gaps: 0 is a real reading, as
# chunks parsed from one socket read share a timestamp (that run: 1400 of 1400 gaps were 0 ms); so
# ITL gaps and per-request ITL means may be 0, never negative. NaN and infinities never.
SAMPLE_FLOOR = {"ttft": ("> 0", lambda v: v > 0), "tpot": ("> 0", lambda v: v > 0),
                "itl": (">= 0", lambda v: v >= 0), "itl_means": (">= 0", lambda v: v >= 0)}
SUMMARIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


@dataclass(frozen=True)
class Problem:
    field: str      # dotted path in the report, e.g. "errors", "samples.ttft.5"
    problem: str
    fix: str

    def render(self) -> str:
        return f"{self.field}: {self.problem}; fix: {self.fix}"


def _counts(b: BenchReport) -> list[Problem]:
    out = [Problem(k, "null or missing: without it the error rate is unknown, never 0", RERUN)
           for k in COUNTS if getattr(b, k) is None]
    out += [Problem(k, f"negative count {getattr(b, k)}", RERUN) for k in COUNTS
            if getattr(b, k) is not None and getattr(b, k) < 0]
    if out:
        return out
    total, ok, errors = b.requests_total or 0, b.requests_ok or 0, b.errors or 0
    if ok + errors != total:
        out.append(Problem("requests_total", f"the counts do not add up: requests_ok {ok} + errors {errors} "
                           f"!= requests_total {total}", RERUN))
    elif b.error_rate is not None:
        want = errors / total if total else None
        if want is None or not math.isfinite(b.error_rate) or abs(b.error_rate - want) > 1e-6:
            out.append(Problem("error_rate", f"{b.error_rate} contradicts the counts ({errors} errors in {total} "
                               f"requests is {'no rate' if want is None else f'{want:.4%}'})",
                               "drop error_rate (the gate computes it from the counts) or re-run `pdops bench`"))
    return out


def _outcomes(b: BenchReport) -> list[Problem]:
    s = b.samples
    if s is None or s.outcomes is None:
        return []
    fix = "write one 0/1 per measured request (validation/metrics.py samples), or drop samples.outcomes"
    bad = next((i for i, v in enumerate(s.outcomes) if v not in (0, 1)), None)
    if bad is not None:
        return [Problem(f"samples.outcomes.{bad}", f"{s.outcomes[bad]} is not 1 (ok) or 0 (error)", fix)]
    out = []
    n, failed = len(s.outcomes), len(s.outcomes) - sum(s.outcomes)
    if (b.requests_total, b.errors) != (n, failed):
        out.append(Problem("samples.outcomes", f"{failed} errors in {n} requests contradict requests_total "
                           f"{b.requests_total} and errors {b.errors}", fix))
    if s.outcome_block is not None and len(s.outcome_block) != n:
        out.append(Problem("samples.outcome_block", f"{len(s.outcome_block)} entries for {n} outcomes", fix))
    return out


def _samples(b: BenchReport) -> list[Problem]:
    s = b.samples
    if s is None:
        return []
    fix = ("re-run `pdops bench`: a sample that is not a real latency is a measurement bug, and the gate does not "
           "drop it quietly")
    out = []
    for key, (rule, fine) in SAMPLE_FLOOR.items():
        vals = getattr(s, key) or []
        bad = next((i for i, v in enumerate(vals) if not (math.isfinite(v) and fine(v))), None)
        if bad is not None:
            out.append(Problem(f"samples.{key}.{bad}", f"{vals[bad]} ms is not a finite latency {rule} "
                               f"({sum(1 for v in vals if not (math.isfinite(v) and fine(v)))} of {len(vals)})", fix))
    if s.itl is not None and (s.itl_counts is None or sum(s.itl_counts) != len(s.itl)
                              or any(c < 0 for c in s.itl_counts)):
        out.append(Problem("samples.itl_counts", f"do not account for the {len(s.itl)} ITL gaps", fix))
    for name in SUMMARIES:
        q = getattr(b, name)
        if isinstance(q, Quantiles):
            out += [Problem(f"{name}.{k}", f"{v} is not a finite latency >= 0", fix)
                    for k, v in q.model_dump().items() if isinstance(v, float) and not (math.isfinite(v) and v >= 0)]
    return out


def _client_health(b: BenchReport) -> list[Problem]:
    # A report without it would read as a healthy client (the model's default); the bench always writes it
    if "client_health" in b.model_fields_set and "client_bottleneck" in b.client_health.model_fields_set:
        return []
    return [Problem("client_health.client_bottleneck", "missing: nothing says the load generator kept up, "
                    "so its latencies cannot be told from the server's", RERUN)]


def problems(bench: BenchReport) -> list[Problem]:
    """Every reason the gate cannot judge this report (empty: it can)."""
    return _counts(bench) + _outcomes(bench) + _samples(bench) + _client_health(bench)
