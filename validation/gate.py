"""Promote or roll back: every SLO threshold checked against every benchmark, plus compat.

`decide` never raises on missing data: a threshold that cannot be checked (no samples, no server
scrape when KV transfer is required) fails, because an unproven candidate is not promoted.

Latency checks on reports with per-request samples are judged with their confidence
(validation/verdicts.py): pass, fail or inconclusive per `slo.statistics`, each stating its interval
and the smallest effect the run could detect. `Decision.extend` lists the benches whose checks
were inconclusive when the spec says to extend and looks remain; the caller may re-run them
and decide again with `look + 1` (validation/sequential.py).

Inputs and output are the typed reports of validation/reports/ (a Decision); a figure a report does not
have is null there, and the check that needs it fails and says so (never judged as 0).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from validation import error_rates, gate_inputs, verdicts
from validation.config import SLO, LoadProfile, VsStable
from validation.reports.bench import BenchReport, Quantiles
from validation.reports.compat import CompatReport
from validation.reports.decision import Check, Decision
from validation.reports.release import GoldenReport


def itl_source(b: BenchReport) -> tuple[Quantiles | None, str]:
    """ITL percentiles and where they come from. Client chunk gaps are inter-token latency only
    when a chunk carries about one token; when the server batches its stream (Ray Serve), the
    server's ITL histogram for the run is used, else TPOT (per token from usage)."""
    if b.itl_level != "chunk":
        return b.itl_ms, "client ITL"
    tpc = (b.tokens_per_chunk.mean if b.tokens_per_chunk else None) or 0.0
    h = b.server.histograms.get("inter_token_latency_seconds") if b.server else None
    if h and h.count:
        return (Quantiles(p90=h.p90_ms, p99=h.p99_ms),
                f"server {h.metric} (client chunks carry {tpc:.1f} tokens)")
    return b.tpot_ms, f"TPOT (client chunks carry {tpc:.1f} tokens; no server ITL histogram)"


def bench_label(b: BenchReport | dict[str, Any], i: int) -> str:
    b = BenchReport.coerce(b)
    load = b.load
    lvl = (f"c={load.concurrency}" if load.concurrency else f"rate={load.rate}" if load.rate
           else f"trace={load.trace}" if load.trace else "")
    return f"#{i} {b.profile or '?'} {lvl}".strip()


LoadKey = tuple[str | None, int | None, float | None, str | None]


def _key(b: BenchReport) -> LoadKey:
    return (b.profile, b.load.concurrency, b.load.rate, b.load.trace)


def planned_key(load: LoadProfile) -> LoadKey:
    """The key a bench of this planned load carries (validation/bench.py: a rate or a trace sets no
    concurrency; a trace is named by its file name)."""
    trace = PurePosixPath(load.trace).name if load.trace else None
    return (load.profile, None if load.rate or trace else load.concurrency, load.rate, trace)


def load_text(key: LoadKey) -> str:
    profile, c, rate, trace = key
    return (f"{profile or '?'} " + (f"c={c}" if c else f"rate={rate:g}" if rate else f"trace={trace}" if trace
                                    else "")).strip()


def loads_check(benches: Sequence[BenchReport], planned: Sequence[LoadProfile]) -> Check:
    """`loads`: the benches given are exactly the loads the release plans (validation.load), so a run
    of one load out of three is not judged as if it were the release's validation."""
    want, got = Counter(planned_key(p) for p in planned), Counter(_key(b) for b in benches)
    missing, extra = want - got, got - want
    text = lambda c: ", ".join(load_text(k) + (f" (x{n})" if n > 1 else "") for k, n in c.items())  # noqa: E731
    msg = (f"loads: {sum(got.values()) - sum(extra.values())} of {sum(want.values())} planned loads measured"
           + (f"; missing: {text(missing)}" if missing else "") + (f"; not planned: {text(extra)}" if extra else "")
           + (" (validation.load in release.yaml)" if missing or extra else ""))
    return Check(check="loads", ok=not missing and not extra, value=[load_text(k) for k in missing.elements()] or None,
                 limit=sum(want.values()), message=msg)


def input_checks(labelled: Sequence[tuple[str, list[gate_inputs.Problem]]]) -> list[Check]:
    """`report_input`: one failing check per defect that makes a report unjudgeable
    (validation/gate_inputs.py), naming the run, the field and the fix."""
    return [Check(check="report_input", ok=False, bench=lab, verdict="fail", message=f"{lab}: {p.render()}")
            for lab, problems in labelled for p in problems]


def no_baseline(vs: VsStable, lab: str | None, why: str) -> Check:
    """The vs_stable check of a load with no baseline run to compare with: fails, unless the spec says
    this environment is gated on absolute SLOs only (slo.vs_stable.without_baseline: absolute_only);
    then it is reported skipped and the decision's first line says so (`decide`)."""
    head = f"{lab}: " if lab else ""
    if vs.without_baseline == "absolute_only":
        return Check(check="vs_stable", ok=True, bench=lab, verdict="skipped",
                     message=f"{head}vs_stable skipped: {why} (slo.vs_stable.without_baseline: absolute_only)")
    return Check(check="vs_stable", ok=False, bench=lab, verdict="fail",
                 message=f"{head}vs_stable not proven: {why}; nothing was compared, so the candidate is not promoted "
                         "on it (fix: measure a baseline, or set slo.vs_stable.without_baseline: absolute_only to gate "
                         "this environment on absolute SLOs only)")


def _q(summary: Quantiles | None, q: str) -> float | None:
    value: float | None = getattr(summary, q) if summary is not None else None
    return value


def decide(compat_in: CompatReport | dict[str, Any] | None, benches_in: Sequence[BenchReport | dict[str, Any]],
           slo: SLO, stable_in: Sequence[BenchReport | dict[str, Any]] | None = None,
           golden_in: GoldenReport | dict[str, Any] | None = None, replaced: list[str] | None = None,
           diff: Any = None, look: int = 1, balance_block: bool = False,
           skipped: dict[str, str] | None = None, planned: Sequence[LoadProfile] | None = None,
           no_baseline_reason: str | None = None) -> Decision:
    """`golden` (validation.golden.compare) is checked when given: targets without a reference engine
    (or a `skipped` one) do not run it. `replaced`: the candidate's engines that were replaced
    while it was validated, where the target can tell; a candidate that lost an engine is unproven
    even when its restarted engine then passed every check (measured: a killed prefill engine).
    `look`: which run of an extended validation this is (1 = the first; slo.statistics).
    `balance_block`: a run whose phases are imbalanced fails (validation.balance.block); otherwise its
    verdict is reported as a passing check.
    `skipped`: check name -> why it could not run (no reference engine this time): listed, verdict
    `skipped`, not blocking, so a skip is never mistaken for a pass.
    `planned`: the release's loads (validation.load); a missing or unplanned load fails the `loads`
    check. None only for callers with no release plan (simulations, scripts/bench_gate.py).
    `no_baseline_reason`: why no baseline was measured (workflows/paired.py), said by vs_stable's no-baseline check.
    Reports may be given as the JSON dicts their producers wrote; they are read as models. A report the
    gate cannot judge (validation/gate_inputs.py: null counts, NaN samples, ...) fails `report_input`
    with the field and the fix, and its own checks are not judged."""
    compat = CompatReport.coerce(compat_in) if compat_in is not None else None
    benches = [BenchReport.coerce(b) for b in benches_in]
    stable = [BenchReport.coerce(b) for b in stable_in] if stable_in is not None else None
    golden = GoldenReport.coerce(golden_in) if golden_in is not None else None
    checks: list[Check] = []
    st = slo.statistics
    extend: set[int] = set()

    def add(name: str, ok: bool, msg: str, bench: str | None = None, value: Any = None, limit: Any = None,
            judged: verdicts.Judged | None = None, idx: int | None = None) -> None:
        c = Check(check=name, ok=bool(ok), bench=bench, value=value, limit=limit, message=msg)
        if judged is not None:
            fin = lambda v: v if isinstance(v, float) and math.isfinite(v) else None  # noqa: E731  (JSON: no Infinity)
            c.verdict = judged.verdict  # type: ignore[assignment]
            c.interval = [fin(v) for v in judged.interval] if judged.interval is not None else None
            c.confidence = judged.confidence
            c.detectable = {k: fin(float(v)) for k, v in judged.detectable.items()}
            if (judged.verdict == "inconclusive" and st.inconclusive == "extend" and look < st.max_looks
                    and idx is not None):
                extend.add(idx)
        checks.append(c)

    # -- compatibility ---------------------------------------------------------------------
    if compat is None:
        add("compat", False, "no compatibility report")
    else:
        req = compat.blocking()
        add("compat", not req, "required compat cases failed: " + ", ".join(req) if req
            else f"compat: {compat.passed if compat.passed is not None else '?'} passed, no required failures",
            value=req)

    if not benches:
        add("bench", False, "no benchmark reports")
    if planned is not None:
        checks.append(loads_check(benches, planned))
    # each report's input problems, found once: they fail `report_input`, keep the report from judgement,
    # and an invalid baseline is compared with nothing
    invalid = [gate_inputs.problems(b) for b in benches]
    stable_invalid = [gate_inputs.problems(s) for s in stable or []]
    baselines = [s for s, bad in zip(stable or [], stable_invalid, strict=True) if not bad]
    checks += input_checks([(bench_label(b, i), bad) for i, (b, bad) in enumerate(zip(benches, invalid, strict=True))]
                           + [(f"baseline {bench_label(s, k)}", bad)
                              for k, (s, bad) in enumerate(zip(stable or [], stable_invalid, strict=True))])

    if golden is not None:
        bad = [c for c in golden.cases if not c.ok]
        add("golden_tokens", golden.ok,
            f"golden tokens: {golden.matched}/{golden.prompts} prompts equal the single-engine "
            f"reference ({golden.tokens_compared} tokens)"
            + "".join(f"; prompt {c.prompt}: " + (c.problem or f"first differs at token {c.first_difference}")
                      for c in bad[:3]), value=golden.matched, limit=golden.prompts)

    if diff is not None:  # pdops diff (validation/diff/): P/D vs single engine, unexpected divergences block
        from validation.diff.verdict import gate_check
        add("diff", *gate_check(diff))

    for name, reason in (skipped or {}).items():
        add(name, True, f"{name.replace('_', ' ')} skipped: {reason}")
        checks[-1].verdict = "skipped"

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
        if invalid[i]:
            continue   # not judged: its report_input checks say why
        lab = bench_label(b, i)
        ch = b.client_health
        if ch.client_bottleneck and slo.client_health == "ignored":
            add("client_bottleneck", True, f"{lab}: client was starved (not gated: slo.client_health ignored): "
                + "; ".join(ch.reasons), lab)
        elif ch.client_bottleneck:
            add("client_bottleneck", False, f"{lab}: measurement void, client was the bottleneck: "
                + "; ".join(ch.reasons), lab)
        else:
            add("client_bottleneck", True, f"{lab}: client healthy", lab)
        ok_n = b.requests_ok
        add("requests_ok", bool(ok_n), f"{lab}: {ok_n if ok_n is not None else 'no count of'} successful requests"
            + ("" if ok_n is not None else f" ({b.missing.get('requests_ok', 'not in the report')})"), lab, ok_n, 1)
        itl, itl_src = itl_source(b)
        for name, metric, q, limit in latency_checks:
            if limit is None:
                continue
            v, src = (_q(itl, q), f" from {itl_src}") if metric == "itl_ms" else (_q(getattr(b, metric), q), "")
            if v is None:
                why = b.missing.get(metric)
                add(name, False, f"{lab}: {metric} {q} unavailable{src} (limit {limit} ms)"
                    + (f": {why}" if why else ""), lab, None, limit)
                continue
            got = verdicts.quantile_samples(b, metric, itl_src)
            if isinstance(got, str):
                add(name, v <= limit, f"{lab}: {metric} {q} {v:.1f} ms{src} {'<=' if v <= limit else '>'} {limit} ms "
                    f"(point estimate: {got})", lab, v, limit)
                continue
            j = verdicts.threshold(got[0], got[1], int(q[1:]) / 100, limit, st, look)
            used = " from TPOT samples" if metric == "itl_ms" and b.itl_level == "chunk" else ""
            add(name, j.ok, f"{lab}: {metric} {q} {v:.1f} ms{src}{used} vs limit {limit} ms, {j.message}",
                lab, v, limit, j, i)
        # exact test on the counts (validation/error_rates.py); the summary error_rate is never read
        checks.append(error_rates.tolerance_check(b, lab, slo.max_error_rate, st.confidence, st.power))
        if slo.min_goodput_rps is not None:
            g = b.goodput_rps
            ok = g is not None and g >= slo.min_goodput_rps
            add("goodput_rps", ok, f"{lab}: goodput {g if g is None else round(g, 3)} req/s "
                f"{'>=' if ok else '<'} {slo.min_goodput_rps}", lab, g, slo.min_goodput_rps)
        if slo.min_slo_attainment is not None:
            a = b.slo_attainment
            ok = a is not None and a >= slo.min_slo_attainment
            add("slo_attainment", ok, f"{lab}: SLO attainment {a if a is None else f'{a:.1%}'} "
                f"{'>=' if ok else '<'} {slo.min_slo_attainment:.1%}", lab, a, slo.min_slo_attainment)
        if b.balance:   # phase balance (validation/balance.py): reported; blocks only when asked
            verdict, why = b.balance.get("verdict"), "; ".join(b.balance.get("reasons") or [])
            bound = verdict in ("prefill-bound", "decode-bound")
            add("phase_balance", not (bound and balance_block), f"{lab}: {verdict}: {why}" + (
                "" if not bound or balance_block else " (reported, not gated: validation.balance.block is false)"),
                lab, None, "balanced" if balance_block else None)
        if slo.kv_transfer == "required":
            kv = b.server.kv if b.server is not None else None
            if kv is None:
                err = b.server.error if b.server is not None else None
                add("kv_transfer", False, f"{lab}: KV transfer required but no server-side evidence"
                    + (f" ({err})" if err else " (run bench with --metrics-url)"), lab)
            elif kv.external_kv_prompt_tokens is None:
                add("kv_transfer", False, f"{lab}: KV transfer required but the report has no count of prompt tokens "
                    "that arrived by KV transfer", lab, None, ">0")
            else:
                toks = kv.external_kv_prompt_tokens
                seen = b.server.requests_seen if b.server is not None else None
                ok_r = b.server.requests_ok if b.server is not None else None
                partial = (f" (the server's metrics show {seen:.0f} of {ok_r} requests: an engine restarted or its "
                           "metrics are late)" if seen is not None and ok_r is not None and seen < ok_r else "")
                add("kv_transfer", toks > 0, f"{lab}: {toks:.0f} prompt tokens arrived by KV transfer"
                    + ("" if toks > 0 else partial), lab, toks, ">0")
                nf = kv.nixl_failed_transfers
                add("nixl_failures", nf == 0, f"{lab}: {nf:.0f} failed NIXL transfers" if nf is not None
                    else f"{lab}: no count of failed NIXL transfers in the report", lab, nf, 0)

    # -- vs stable ---------------------------------------------------------------------------
    vs = slo.vs_stable
    unproven: list[str] = []   # why a load had no baseline (without_baseline: absolute_only)
    if vs is not None:
        if not stable:
            checks.append(no_baseline(vs, None, why := no_baseline_reason or "no baseline run was given (a first "
                                                       "release, or no room for a baseline)"))
            unproven.append(why)
        else:
            idx = {_key(s): s for s in baselines}
            comparisons = sum(1 for b in benches if _key(b) in idx for f in (vs.ttft_p90, vs.tpot_p90, vs.itl_p90)
                              if f is not None)
            for i, b in enumerate(benches):
                if invalid[i]:
                    continue
                lab = bench_label(b, i)
                s = idx.get(_key(b))
                if s is None:
                    why = (f"no valid baseline run at {load_text(_key(b))} (baseline runs: "
                           + (", ".join(load_text(_key(x)) for x in baselines) or "none valid") + ")"
                           + (f"; {no_baseline_reason}" if no_baseline_reason else ""))
                    checks.append(no_baseline(vs, lab, why))
                    unproven.append(f"{lab}: {why}")
                    continue
                checks.append(error_rates.baseline_check(b, s, lab, st.confidence))
                for name, metric, factor in (("ttft_p90", "ttft_ms", vs.ttft_p90), ("tpot_p90", "tpot_ms", vs.tpot_p90),
                                             ("itl_p90", "itl_ms", vs.itl_p90)):
                    if factor is None:
                        continue
                    chunk = "chunk" in (b.itl_level, s.itl_level)   # then both sides use TPOT
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
                        cv, sv = _q(cd, "p90"), _q(sd, "p90")
                        src = f" (candidate from {csrc}, stable from {ssrc})"
                    else:
                        cv, sv, src = _q(getattr(b, metric), "p90"), _q(getattr(s, metric), "p90"), ""
                    if cv is None or not sv:
                        add(f"vs_stable_{name}", False,
                            f"{lab}: {name} cannot be compared (candidate {cv}, stable {sv}){src}", lab)
                        continue
                    r = cv / sv
                    add(f"vs_stable_{name}", r <= factor,
                        f"{lab}: {name} {cv:.1f} ms is {r:.2f}x stable {sv:.1f} ms (limit {factor}x){src} "
                        f"(point estimate: {why})", lab, r, factor)
                if vs.cost is not None:   # cost gate: computed in validation/cost.py
                    from validation.cost import vs_stable_cost
                    checks.append(vs_stable_cost(b, s, vs.cost, lab))

    scope = ("gated on absolute SLOs only: " + "; ".join(unproven)
             if unproven and vs is not None and vs.without_baseline == "absolute_only" else None)
    return Decision.of(checks, look, extend, scope)
