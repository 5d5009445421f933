"""Extending an inconclusive run (slo.statistics.inconclusive: extend): the same load again, merged.

The correction for the repeated looks is in the confidence each look is judged at
(validation/verdicts.py: 1 - (1 - confidence) / max_looks, Bonferroni over the planned looks), so
any number of looks up to max_looks keeps each error rate under 1 - confidence. Looks are planned,
not open-ended: the last one's inconclusive checks fail.
"""
from __future__ import annotations

from validation import metrics


def merge_bench(a: dict, b: dict) -> dict:
    """Two runs of one load as one report: counts summed, samples concatenated, latency summaries
    recomputed from the merged samples; server evidence summed (KV tokens, NIXL failures) when both
    runs have it, else the latest run's (missing evidence stays missing); the latest run's histograms
    kept. `looks` lists each run's own summary."""
    sa, sb = a.get("samples") or {}, b.get("samples") or {}
    samples = {k: (sa.get(k) or []) + (sb.get(k) or []) for k in ("ttft", "tpot", "itl", "itl_counts")}
    out = {**b, "samples": samples}
    for k in ("requests_total", "requests_ok", "errors", "goodput_requests", "wall_s"):
        out[k] = (a.get(k) or 0) + (b.get(k) or 0)
    out["error_rate"] = out["errors"] / out["requests_total"] if out["requests_total"] else 0.0
    out["goodput_rps"] = out["goodput_requests"] / out["wall_s"] if out["wall_s"] else 0.0
    out["slo_attainment"] = out["goodput_requests"] / out["requests_total"] if out["requests_total"] else 0.0
    for m in ("ttft", "tpot", "itl"):
        out[f"{m}_ms"] = metrics.summary(samples[m])
    ha, hb = a.get("client_health") or {}, b.get("client_health") or {}
    out["client_health"] = {**hb, "client_bottleneck": bool(ha.get("client_bottleneck") or hb.get("client_bottleneck")),
                            "reasons": (ha.get("reasons") or []) + (hb.get("reasons") or [])}
    ka, kb = (a.get("server") or {}).get("kv"), (b.get("server") or {}).get("kv")
    if ka and kb:
        out["server"] = {**b["server"], "kv": {k: (ka.get(k) or 0) + (kb.get(k) or 0)
                                               for k in ("external_kv_prompt_tokens", "nixl_failed_transfers")}}
    looks = a.get("looks") or [{k: a.get(k) for k in ("requests_ok", "ttft_ms", "tpot_ms", "itl_ms")}]
    out["looks"] = looks + [{k: b.get(k) for k in ("requests_ok", "ttft_ms", "tpot_ms", "itl_ms")}]
    return out
