"""Promote or roll back: every SLO threshold checked against every benchmark, plus compat.

`decide` never raises on missing data: a threshold that cannot be checked (no samples, no server
scrape when KV transfer is required) fails, because an unproven candidate is not promoted.

Latency checks on reports with per-request samples are judged with their confidence
(validation/verdicts.py): pass, fail or inconclusive per `slo.statistics`, each stating its interval
and the smallest effect the run could detect. `decision["extend"]` lists the benches whose checks
were inconclusive when the spec says to extend and looks remain; the caller may re-run them
and decide again with `look + 1` (validation/sequential.py).
"""
from __future__ import annotations

import math
from typing import Any

from validation import verdicts
from validation.config import SLO


def _get(d: dict, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def itl_source(b: dict) -> tuple[dict | None, str]:
    """ITL percentiles and where they come from. Client chunk gaps are inter-token latency only
    when a chunk carries about one token; when the server batches its stream (Ray Serve), the
    server's ITL histogram for the run is used, else TPOT (per token from usage)."""
    if b.get("itl_level") != "chunk":
        return b.get("itl_ms"), "client ITL"
    tpc = _get(b, "tokens_per_chunk", "mean") or 0.0
    h = _get(b, "server", "histograms", "inter_token_latency_seconds")
    if h and h.get("count"):
        return ({"p90": h.get("p90_ms"), "p99": h.get("p99_ms")},
                f"server {h['metric']} (client chunks carry {tpc:.1f} tokens)")
    return b.get("tpot_ms"), f"TPOT (client chunks carry {tpc:.1f} tokens; no server ITL histogram)"


def bench_label(b: dict, i: int) -> str:
    load = b.get("load") or {}
    lvl = (f"c={load['concurrency']}" if load.get("concurrency") else f"rate={load['rate']}" if load.get("rate")
           else f"trace={load['trace']}" if load.get("trace") else "")
    return f"#{i} {b.get('profile', '?')} {lvl}".strip()


def _key(b: dict) -> tuple:
    load = b.get("load") or {}
    return (b.get("profile"), load.get("concurrency"), load.get("rate"), load.get("trace"))


def decide(compat: dict | None, benches: list[dict], slo: SLO, stable: list[dict] | None = None,
           golden: dict | None = None, replaced: list[str] | None = None, diff: dict | None = None,
           look: int = 1, skipped: dict[str, str] | None = None) -> dict:
    """`golden` (validation.golden.compare) is checked when given: targets without a reference engine
    (or a `skipped` one) do not run it. `replaced`: the candidate's engines that were replaced
    while it was validated, where the target can tell; a candidate that lost an engine is unproven
    even when its restarted engine then passed every check (measured: a killed prefill engine).
    `look`: which run of an extended validation this is (1 = the first; slo.statistics).
    `skipped`: check name -> why it could not run (no reference engine this time): listed, verdict
    `skipped`, not blocking, so a skip is never mistaken for a pass."""
    checks: list[dict] = []
    st = slo.statistics
    extend: set[int] = set()

    def add(name: str, ok: bool, msg: str, bench: str | None = None, value=None, limit=None,
            judged: verdicts.Judged | None = None, idx: int | None = None) -> None:
        c = {"check": name, "ok": bool(ok), "bench": bench, "value": value, "limit": limit, "message": msg}
        if judged is not None:
            fin = lambda v: v if isinstance(v, float) and math.isfinite(v) else None  # noqa: E731  (JSON: no Infinity)
            c.update(verdict=judged.verdict, interval=[fin(v) for v in judged.interval], confidence=judged.confidence,
                     detectable={k: fin(float(v)) for k, v in judged.detectable.items()})
            if judged.verdict == "inconclusive" and st.inconclusive == "extend" and look < st.max_looks:
                extend.add(idx)
        checks.append(c)

    # -- compatibility ---------------------------------------------------------------------
    if compat is None:
        add("compat", False, "no compatibility report")
    else:
        req = compat.get("required_failures")
        if req is None:
            req = [c["name"] for c in compat.get("cases", []) if c.get("status") == "fail" and c.get("required", True)]
        add("compat", not req, "required compat cases failed: " + ", ".join(req) if req
            else f"compat: {compat.get('passed', '?')} passed, no required failures", value=req)

    if not benches:
        add("bench", False, "no benchmark reports")

    if golden is not None:
        bad = [c for c in golden.get("cases", []) if not c.get("ok")]
        add("golden_tokens", bool(golden.get("ok")),
            f"golden tokens: {golden.get('matched', 0)}/{golden.get('prompts', 0)} prompts equal the single-engine "
            f"reference ({golden.get('tokens_compared', 0)} tokens)"
            + "".join(f"; prompt {c['prompt']}: " + (c.get("problem") or f"first differs at token {c['first_difference']}")
                      for c in bad[:3]), value=golden.get("matched"), limit=golden.get("prompts"))

    if diff is not None:  # pdops diff (validation/diff/): P/D vs single engine, unexpected divergences block
        from validation.diff.release import gate_check
        add("diff", *gate_check(diff))

    for name, why in (skipped or {}).items():
        add(name, True, f"{name.replace('_', ' ')} skipped: {why}")
        checks[-1]["verdict"] = "skipped"

    if replaced is not None:
        add("engines_stable", not replaced, "engines replaced during validation: " + "; ".join(replaced)
            if replaced else "no engine was replaced during validation", value=replaced)

    latency_checks = [
        ("ttft_p90_ms", "ttft_ms", "p90", slo.prefill.ttft_p90_ms),
        ("ttft_p99_ms", "ttft_ms", "p99", slo.prefill.ttft_p99_ms),
        ("itl_p90_ms", "itl_ms", "p90", slo.decode.itl_p90_ms),
        ("itl_p99_ms", "itl_ms", "p99", slo.decode.itl_p99_ms),
        ("tpot_p90_ms", "tpot_ms", "p90", slo.decode.tpot_p90_ms),
        ("tpot_p99_ms", "tpot_ms", "p99", slo.decode.tpot_p99_ms),
    ]
    for i, b in enumerate(benches):
        lab = bench_label(b, i)
        ch = b.get("client_health") or {}
        if ch.get("client_bottleneck") and slo.client_health == "ignored":
            add("client_bottleneck", True, f"{lab}: client was starved (not gated: slo.client_health ignored): "
                + "; ".join(ch.get("reasons", [])), lab)
        elif ch.get("client_bottleneck"):
            add("client_bottleneck", False, f"{lab}: measurement void, client was the bottleneck: "
                + "; ".join(ch.get("reasons", [])), lab)
        else:
            add("client_bottleneck", True, f"{lab}: client healthy", lab)
        ok_n = b.get("requests_ok") or 0
        add("requests_ok", ok_n > 0, f"{lab}: {ok_n} successful requests", lab, ok_n, 1)
        itl, itl_src = itl_source(b)
        for name, metric, q, limit in latency_checks:
            if limit is None:
                continue
            v, src = ((itl or {}).get(q), f" from {itl_src}") if metric == "itl_ms" else (_get(b, metric, q), "")
            if v is None:
                add(name, False, f"{lab}: {metric} {q} unavailable{src} (limit {limit} ms)", lab, None, limit)
                continue
            got = verdicts.quantile_samples(b, metric, itl_src)
            if isinstance(got, str):
                add(name, v <= limit, f"{lab}: {metric} {q} {v:.1f} ms{src} {'<=' if v <= limit else '>'} {limit} ms "
                    f"(point estimate: {got})", lab, v, limit)
                continue
            j = verdicts.threshold(got[0], got[1], int(q[1:]) / 100, limit, st, look)
            used = " from TPOT samples" if metric == "itl_ms" and b.get("itl_level") == "chunk" else ""
            add(name, j.ok, f"{lab}: {metric} {q} {v:.1f} ms{src}{used} vs limit {limit} ms, {j.message}",
                lab, v, limit, j, i)
        er = b.get("error_rate")
        if er is None:
            tot = (b.get("requests_ok") or 0) + (b.get("errors") or 0)
            er = (b.get("errors") or 0) / tot if tot else 1.0
        add("error_rate", er <= slo.max_error_rate,
            f"{lab}: error rate {er:.2%} {'<=' if er <= slo.max_error_rate else '>'} {slo.max_error_rate:.2%}",
            lab, er, slo.max_error_rate)
        if slo.min_goodput_rps is not None:
            g = b.get("goodput_rps")
            ok = g is not None and g >= slo.min_goodput_rps
            add("goodput_rps", ok, f"{lab}: goodput {g if g is None else round(g, 3)} req/s "
                f"{'>=' if ok else '<'} {slo.min_goodput_rps}", lab, g, slo.min_goodput_rps)
        if slo.min_slo_attainment is not None:
            a = b.get("slo_attainment")
            ok = a is not None and a >= slo.min_slo_attainment
            add("slo_attainment", ok, f"{lab}: SLO attainment {a if a is None else f'{a:.1%}'} "
                f"{'>=' if ok else '<'} {slo.min_slo_attainment:.1%}", lab, a, slo.min_slo_attainment)
        if slo.kv_transfer == "required":
            kv = _get(b, "server", "kv")
            if not kv:
                err = _get(b, "server", "error")
                add("kv_transfer", False, f"{lab}: KV transfer required but no server-side evidence"
                    + (f" ({err})" if err else " (run bench with --metrics-url)"), lab)
            else:
                toks = kv.get("external_kv_prompt_tokens") or 0
                seen, ok = _get(b, "server", "requests_seen"), _get(b, "server", "requests_ok")
                partial = (f" (the server's metrics show {seen:.0f} of {ok} requests: an engine restarted or its "
                           "metrics are late)" if seen is not None and ok is not None and seen < ok else "")
                add("kv_transfer", toks > 0, f"{lab}: {toks:.0f} prompt tokens arrived by KV transfer"
                    + ("" if toks > 0 else partial), lab, toks, ">0")
                nf = kv.get("nixl_failed_transfers") or 0
                add("nixl_failures", nf == 0, f"{lab}: {nf:.0f} failed NIXL transfers", lab, nf, 0)

    # -- vs stable ---------------------------------------------------------------------------
    vs = slo.vs_stable
    if vs is not None:
        if not stable:
            add("vs_stable", True, "no stable report to compare against (first release?)")
        else:
            idx = {_key(s): s for s in stable}
            comparisons = sum(1 for b in benches if _key(b) in idx for f in (vs.ttft_p90, vs.tpot_p90, vs.itl_p90)
                              if f is not None)
            for i, b in enumerate(benches):
                lab = bench_label(b, i)
                s = idx.get(_key(b))
                if s is None:
                    add("vs_stable", True, f"{lab}: no matching stable run (same profile and load)", lab)
                    continue
                for name, metric, factor in (("ttft_p90", "ttft_ms", vs.ttft_p90), ("tpot_p90", "tpot_ms", vs.tpot_p90),
                                             ("itl_p90", "itl_ms", vs.itl_p90)):
                    if factor is None:
                        continue
                    chunk = "chunk" in (b.get("itl_level"), s.get("itl_level"))   # then both sides use TPOT
                    cs, ss = verdicts.request_samples(b, metric, chunk), verdicts.request_samples(s, metric, chunk)
                    if not isinstance(cs, str) and not isinstance(ss, str):
                        j = verdicts.vs_stable(cs, ss, factor, st, look, comparisons)
                        what = {"ttft_ms": "TTFT", "tpot_ms": "TPOT",
                                "itl_ms": "TPOT (chunk-level ITL)" if chunk else "per-request mean ITL"}[metric]
                        add(f"vs_stable_{name}", j.ok, f"{lab}: {name}: {what} {j.message}", lab,
                            j.detectable["ratio"], factor, j, i)
                        continue
                    why = cs if isinstance(cs, str) else f"stable: {ss}"
                    if metric == "itl_ms":
                        (cd, csrc), (sd, ssrc) = itl_source(b), itl_source(s)
                        cv, sv = (cd or {}).get("p90"), (sd or {}).get("p90")
                        src = f" (candidate from {csrc}, stable from {ssrc})"
                    else:
                        cv, sv, src = _get(b, metric, "p90"), _get(s, metric, "p90"), ""
                    if cv is None or not sv:
                        add(f"vs_stable_{name}", False, f"{lab}: {name} cannot be compared (candidate {cv}, stable {sv}){src}", lab)
                        continue
                    r = cv / sv
                    add(f"vs_stable_{name}", r <= factor,
                        f"{lab}: {name} {cv:.1f} ms is {r:.2f}x stable {sv:.1f} ms (limit {factor}x){src} "
                        f"(point estimate: {why})", lab, r, factor)
                if vs.cost is not None:   # cost gate: computed in validation/cost.py
                    from validation.cost import vs_stable_cost
                    add(*vs_stable_cost(b, s, vs.cost, lab))

    failed = [c for c in checks if not c["ok"]]
    return {"verdict": "rollback" if failed else "promote",
            "reasons": [c["message"] for c in failed] or ["all checks passed"],
            "checks": checks, "failed": len(failed), "passed": len(checks) - len(failed),
            "inconclusive": sum(1 for c in checks if c.get("verdict") == "inconclusive"),
            "look": look, "extend": sorted(extend) if extend and all(
                c.get("verdict") == "inconclusive" for c in failed) else []}
