"""Run cases against a candidate and a reference, one request at a time on each, and build the report.

Each side gets one request at a time: two requests in flight on one engine are batched together, and
a different batch shape may change a float and so a greedy token — a false divergence. The two sides
are different engines (a P/D candidate and a single-engine reference), so a case sends its candidate
and its reference request together, then the streamed pair together: half the suite's wall time
(the 116 cases of the local release: about 65 s one request at a time). When both URLs are the same
(an engine diffed against itself) the requests go strictly one after the other: candidate,
reference, candidate streamed, reference streamed.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from validation.diff import compare, known as known_mod, scenarios
from validation.diff.client import send
from validation.diff.models import Answer, Api, Case, CaseResult, KnownDivergence, Report, Side, Summary

STREAM_OPTIONS = {"include_usage": True}


def bodies(case: Case, model: str) -> tuple[dict, dict | None]:
    """The exact non-streamed body, and its streamed twin when the case asks for one."""
    body = copy.deepcopy(case.body)
    body.setdefault("model", model)
    if not case.also_stream or body.get("stream"):
        return body, None
    streamed = {**copy.deepcopy(body), "stream": True}
    streamed.setdefault("stream_options", STREAM_OPTIONS)
    return body, streamed


class Sender:
    """Sends one body to both sides: together when they are different engines, else one after the other."""

    def __init__(self, base_url: str, reference_url: str, api_key: str | None, timeout: float) -> None:
        self.base_url, self.reference_url, self.api_key = base_url, reference_url, api_key
        limits = httpx.Timeout(timeout, connect=10.0)
        self.client, self.reference_client = httpx.Client(timeout=limits), httpx.Client(timeout=limits)
        same = base_url.rstrip("/") == reference_url.rstrip("/")
        self.pool = None if same else ThreadPoolExecutor(max_workers=1, thread_name_prefix="diff-reference")

    def both(self, api: Api, body: dict) -> tuple[Answer, Answer]:
        if self.pool is None:
            return (send(self.client, self.base_url, api, body, self.api_key),
                    send(self.client, self.reference_url, api, body, self.api_key))
        reference = self.pool.submit(send, self.reference_client, self.reference_url, api, body, self.api_key)
        return send(self.client, self.base_url, api, body, self.api_key), reference.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.client.close()
        self.reference_client.close()


def run_case(sender: Sender, case: Case, model: str) -> CaseResult:
    body, streamed = bodies(case, model)
    answer, reference = sender.both(case.api, body)
    cand, ref = Side(answer=answer), Side(answer=reference)
    if streamed is not None:
        cand.streamed, ref.streamed = sender.both(case.api, streamed)
    result = CaseResult(name=case.name, api=case.api, request=body, stream_request=streamed, outcome="same",
                        candidate=cand, reference=ref, source=case.source)
    broken = [a for a in (ref.answer, ref.streamed) if a is not None and a.transport_error]
    if broken:  # no reference answer: nothing to compare against (not the candidate's fault)
        result.outcome, result.detail = "error", f"reference gave no answer: {broken[0].transport_error}"
        return result
    diffs, notes = compare.case(cand, ref)
    if case.expect is not None:
        diffs += ["expect: " + d for d in scenarios.check(case.expect, cand.answer)]
    result.differences = diffs + notes
    if diffs:
        result.outcome, result.detail = "differs", "; ".join(diffs)
    else:
        result.detail = "; ".join(notes)
    return result


def run(cases: list[Case], base_url: str, reference_url: str, model: str, *, api_key: str | None = None,
        known: list[KnownDivergence] | None = None, timeout: float = 120.0,
        progress: Callable[[str], None] = lambda _: None, uncovered: dict | None = None) -> Report:
    started = time.monotonic()
    results = []
    sender = Sender(base_url, reference_url, api_key, timeout)
    try:
        for i, case in enumerate(cases, 1):
            r = run_case(sender, case, model)
            results.append(r)
            progress(f"[diff] {i}/{len(cases)} {case.name}: {r.outcome}"
                     + (f" — {r.detail[:160]}" if r.outcome != "same" else ""))
    finally:
        sender.close()
    gone, unused = known_mod.apply(results, known or [])
    count = {o: sum(r.outcome == o for r in results) for o in ("same", "differs", "known", "error")}
    summary = Summary(cases=len(results), **count, known_not_reproduced=gone, known_unused=unused,
                      seconds=round(time.monotonic() - started, 1), base_url=base_url,
                      reference_url=reference_url, model=model, ok=count["differs"] == 0 and count["error"] == 0)
    return Report(cases=results, summary=summary, uncovered=uncovered or {})


def table(report: Report) -> str:
    """One line per case that is not `same`, then the totals: what a person reads first."""
    lines = [f"{'case':36} {'api':11} {'outcome':8} detail"]
    for r in report.cases:
        if r.outcome != "same":
            why = f"known: {r.known.reason[:80]} ({r.known.link})" if r.known else r.detail
            lines.append(f"{r.name[:36]:36} {r.api:11} {r.outcome:8} {why[:220]}")
    s = report.summary
    lines.append(f"{s.cases} cases: {s.same} same, {s.differs} differ, {s.known} known, {s.error} error "
                 f"in {s.seconds:.0f}s")
    for name in s.known_not_reproduced:
        lines.append(f"known divergence {name!r} no longer reproduces: remove it from the known file")
    for name in s.known_unused:
        lines.append(f"known divergence {name!r} names no case that ran")
    return "\n".join(lines)
