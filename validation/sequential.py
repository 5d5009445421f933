"""Extending an inconclusive run (slo.statistics.inconclusive: extend): the same load again, merged.

The correction for the repeated looks is in the confidence each look is judged at
(validation/verdicts.py: 1 - (1 - confidence) / max_looks, Bonferroni over the planned looks), so
any number of looks up to max_looks keeps each error rate under 1 - confidence. Looks are planned,
not open-ended: the last one's inconclusive checks fail.
"""
from __future__ import annotations

from typing import Any

from validation import metrics
from validation.reports.bench import BenchReport, KvEvidence, Quantiles, Samples


def _add(x: float | None, y: float | None) -> float | None:
    """A sum of two runs' figures; null when either run lacks it (a half-known total is not a total)."""
    return None if x is None or y is None else x + y


def _both(x: list[Any] | None, y: list[Any] | None) -> list[Any] | None:
    return x + y if x is not None and y is not None else None


def _look(b: BenchReport) -> dict[str, object]:
    return {"requests_ok": b.requests_ok, **{k: (getattr(b, k) or Quantiles()).model_dump(mode="json")
                                             for k in ("ttft_ms", "tpot_ms", "itl_ms")}}


def merge_bench(a: BenchReport, b: BenchReport) -> BenchReport:
    """Two runs of one load as one report: counts summed, samples concatenated, latency summaries
    recomputed from the merged samples; server evidence summed (KV tokens, NIXL failures) when both runs have it, else
    the latest run's (missing evidence stays missing); the latest run's histograms kept. `looks` lists
    each run's own summary."""
    sa, sb = a.samples or Samples(), b.samples or Samples()
    samples = Samples(ttft=(sa.ttft or []) + (sb.ttft or []), tpot=(sa.tpot or []) + (sb.tpot or []),
                      itl=(sa.itl or []) + (sb.itl or []), itl_counts=(sa.itl_counts or []) + (sb.itl_counts or []),
                      # per-request outcomes only when both runs have them (else the summed counts are the truth)
                      outcomes=sa.outcomes + sb.outcomes if sa.outcomes is not None and sb.outcomes is not None
                      else None,
                      # block ids (the gate's pairs, validation/judge.py) only when both runs have them
                      block=_both(sa.block, sb.block),
                      outcome_block=_both(sa.outcome_block, sb.outcome_block),
                      itl_means=_both(sa.itl_means, sb.itl_means))
    out = b.model_copy(deep=True)
    out.samples = samples
    total, errors = _add(a.requests_total, b.requests_total), _add(a.errors, b.errors)
    good, wall = _add(a.goodput_requests, b.goodput_requests), _add(a.wall_s, b.wall_s)
    out.requests_total = None if total is None else int(total)
    out.requests_ok = None if (ok := _add(a.requests_ok, b.requests_ok)) is None else int(ok)
    out.errors = None if errors is None else int(errors)
    out.goodput_requests = None if good is None else int(good)
    out.wall_s = wall
    out.error_rate = errors / total if errors is not None and total else None
    out.goodput_rps = good / wall if good is not None and wall else None
    out.slo_attainment = good / total if good is not None and total else None
    for m in ("ttft", "tpot", "itl"):
        setattr(out, f"{m}_ms", Quantiles.model_validate(metrics.summary(getattr(samples, m) or [])))
    ha, hb = a.client_health, b.client_health
    out.client_health = hb.model_copy(update={"client_bottleneck": ha.client_bottleneck or hb.client_bottleneck,
                                              "reasons": ha.reasons + hb.reasons})
    ka = a.server.kv if a.server is not None else None
    kb = b.server.kv if b.server is not None else None
    if ka is not None and kb is not None and out.server is not None:
        out.server.kv = KvEvidence.model_validate({
            **kb.model_dump(),
            "external_kv_prompt_tokens": _add(ka.external_kv_prompt_tokens, kb.external_kv_prompt_tokens),
            "nixl_failed_transfers": _add(ka.nixl_failed_transfers, kb.nixl_failed_transfers)})
    out.looks = (a.looks or [_look(a)]) + [_look(b)]
    recomputed = ("requests_total", "requests_ok", "errors", "goodput_requests", "wall_s", "error_rate", "goodput_rps",
                  "slo_attainment", "ttft_ms", "tpot_ms", "itl_ms", "server.kv")
    out.missing = {k: v for k, v in b.missing.items() if k not in recomputed}
    return BenchReport.model_validate(out.model_dump())   # reasons for what the merge could not know
