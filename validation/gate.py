"""Promote or roll back: every SLO threshold checked against every benchmark, plus compat.

`decide` never raises on missing data: a threshold that cannot be checked (no samples, no server
scrape when KV transfer is required) fails, because an unproven candidate is not promoted.

Latency checks on reports with per-request samples are judged by validation/judge.py: pass, fail or
inconclusive, each stating its interval (block-level: the run's blocks, or pairs of candidate and
baseline blocks), what it can detect, and the share of the decision's false-rollback budget it spent
(`slo.statistics`). `Decision.extend` lists the benches whose checks were inconclusive when the spec
says to extend and looks remain; the caller may re-run them and decide again with `look + 1`
(validation/sequential.py).

Inputs and output are the typed reports of validation/reports/ (a Decision); a figure a report does not
have is null there, and the check that needs it fails and says so (never judged as 0).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from validation import error_rates, gate_inputs, judge, stats, verdicts
from validation.config import SLO, LoadProfile, Statistics, VsStable
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
    of one load out of three is not judged as if it were the release's validation. After a load that
    stopped early (its `stopped_early` check fails the release) the later loads are not measured: said,
    and not a second failure."""
    want, got = Counter(planned_key(p) for p in planned), Counter(_key(b) for b in benches)
    missing, extra = want - got, got - want
    stop = next((load_text(_key(b)) for b in benches if b.stopped_early is not None), None)
    text = lambda c: ", ".join(load_text(k) + (f" (x{n})" if n > 1 else "") for k, n in c.items())  # noqa: E731
    msg = (f"loads: {sum(got.values()) - sum(extra.values())} of {sum(want.values())} planned loads measured"
           + (f"; not measured: {text(missing)}, since {stop} stopped early (a certain rollback)" if missing and stop
              else f"; missing: {text(missing)}" if missing else "")
           + (f"; not planned: {text(extra)}" if extra else "")
           + (" (validation.load in release.yaml)" if (missing and not stop) or extra else ""))
    return Check(check="loads", ok=(not missing or stop is not None) and not extra,
                 value=[load_text(k) for k in missing.elements()] or None, limit=sum(want.values()), message=msg)


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


def _fin(v: float) -> float | None:
    return v if math.isfinite(v) else None     # JSON has no Infinity: an absent bound is null


class _Checks:
    """The decision's checks as they are made, and the benches to extend (slo.statistics: extend)."""

    def __init__(self, st: Statistics, look: int) -> None:
        self.st, self.look = st, look
        self.items: list[Check] = []
        self.extend: set[int] = set()

    def add(self, name: str, ok: bool, msg: str, bench: str | None = None, value: Any = None, limit: Any = None,
            judged: judge.Judged | None = None, idx: int | None = None) -> Check:
        c = Check(check=name, ok=bool(ok), bench=bench, value=value, limit=limit, message=msg)
        if judged is not None:
            c.verdict = judged.verdict  # type: ignore[assignment]
            c.interval = [_fin(v) for v in judged.interval] if judged.interval is not None else None
            c.confidence = judged.confidence
            c.alpha = judged.alpha
            c.detectable = {k: _fin(float(v)) for k, v in judged.detectable.items()}
            st = self.st
            if (judged.verdict == "inconclusive" and st.inconclusive == "extend" and self.look < st.max_looks
                    and idx is not None):
                self.extend.add(idx)
        self.items.append(c)
        return c


def _compat_check(out: _Checks, compat: CompatReport | None) -> None:
    if compat is None:
        out.add("compat", False, "no compatibility report")
    else:
        req = compat.blocking()
        out.add("compat", not req, "required compat cases failed: " + ", ".join(req) if req
                else f"compat: {compat.passed if compat.passed is not None else '?'} passed, no required failures",
                value=req)


def _release_checks(out: _Checks, golden: GoldenReport | None, diff: Any, skipped: dict[str, str] | None,
                    replaced: list[str] | None) -> None:
    """Golden tokens, the differential suite, skips and replaced engines."""
    if golden is not None:
        bad = [c for c in golden.cases if not c.ok]
        out.add("golden_tokens", golden.ok,
                f"golden tokens: {golden.matched}/{golden.prompts} prompts equal the single-engine "
                f"reference ({golden.tokens_compared} tokens)"
                + "".join(f"; prompt {c.prompt}: " + (c.problem or f"first differs at token {c.first_difference}")
                          for c in bad[:3]), value=golden.matched, limit=golden.prompts)
    if diff is not None:  # pdops diff (validation/diff/): P/D vs single engine, unexpected divergences block
        from validation.diff.verdict import gate_check
        out.add("diff", *gate_check(diff))
    for name, reason in (skipped or {}).items():
        out.add(name, True, f"{name.replace('_', ' ')} skipped: {reason}").verdict = "skipped"
    if replaced is not None:
        out.add("engines_stable", not replaced, "engines replaced during validation: " + "; ".join(replaced)
                if replaced else "no engine was replaced during validation", value=replaced)


def _latency_checks(out: _Checks, b: BenchReport, lab: str, i: int, slo: SLO, bud: judge.Budget) -> None:
    """The absolute SLO quantiles of one run (judge.absolute, block-level intervals)."""
    itl, itl_src = itl_source(b)
    for p in judge.planned_checks(slo):
        if p.kind != "absolute":
            continue
        name, metric, q, limit = p.check, str(p.metric), float(p.q or 0), float(p.limit or 0)
        qn = f"p{stats.q_name(q)}"
        v, src = (_q(itl, qn), f" from {itl_src}") if metric == "itl_ms" else (_q(getattr(b, metric), qn), "")
        if v is None:
            why = b.missing.get(metric)
            out.add(name, False, f"{lab}: {metric} {qn} unavailable{src} (limit {limit} ms)"
                    + (f": {why}" if why else ""), lab, None, limit)
            continue
        got = verdicts.quantile_samples(b, metric, itl_src)
        if isinstance(got, str):
            out.add(name, v <= limit, f"{lab}: {metric} {qn} {v:.1f} ms{src} {'<=' if v <= limit else '>'} {limit} ms "
                    f"(point estimate: {got})", lab, v, limit)
            continue
        per = "ttft_ms" if metric == "ttft_ms" else "tpot_ms"     # chunk-level ITL is judged on TPOT
        untimed = judge.tpot_coverage(b) if per == "tpot_ms" and got[1] is None else None
        if untimed:
            _untimed(out, name, lab, f"{metric} {qn} {v:.1f} ms{src} (limit {limit} ms)", v, limit, untimed)
            continue
        values = judge.gap_values(b) if got[1] is not None else judge.request_values(b, per)
        if isinstance(values, str):
            out.add(name, False, f"{lab}: {metric} {qn} {v:.1f} ms{src} not judged: {values}", lab, v, limit)
            continue
        j = judge.absolute(values, q, limit, bud, out.st, out.look)
        used = " from TPOT samples" if metric == "itl_ms" and b.itl_level == "chunk" else ""
        out.add(name, j.ok, f"{lab}: {metric} {qn} {v:.1f} ms{src}{used} vs limit {limit} ms, {j.message}",
                lab, v, limit, j, i)


def _untimed(out: _Checks, name: str, lab: str, what: str, point: float, limit: float, why: str) -> None:
    """A TPOT check on a run whose client timed too few requests (judge.tpot_coverage): no interval, so
    inconclusive, and slo.statistics.inconclusive decides (fail by default: closed; point_estimate: the
    timed requests' own figure, which no client stall shrank, decode_timing having voided those)."""
    ok, note = judge.policy("inconclusive", point <= limit, out.st, out.look)
    c = out.add(name, ok, f"{lab}: {what}: no interval: {why}: inconclusive{note}", lab, point, limit)
    c.verdict = "inconclusive"


def _client_check(out: _Checks, b: BenchReport, lab: str, slo: SLO) -> None:
    starved = b.client_health.starved()
    if starved is not None and slo.client_health == "ignored":
        out.add("client_bottleneck", True, f"{lab}: client was starved (not gated: slo.client_health ignored): "
                + starved, lab)
    elif starved is not None:
        runs = (f" (every one of its {len(b.void_attempts) + 1} runs void; slo.remeasure_void measured it "
                f"{len(b.void_attempts)} time(s) more)") if b.void_attempts else ""
        out.add("client_bottleneck", False, f"{lab}: measurement void, client was the bottleneck{runs}: "
                + starved, lab)
    else:
        again = (f" (measured again after {len(b.void_attempts)} void run(s), slo.remeasure_void: "
                 + "; ".join(b.void_attempts) + ")") if b.void_attempts else ""
        out.add("client_bottleneck", True, f"{lab}: client healthy{again}", lab)
    ok_n = b.requests_ok
    out.add("requests_ok", bool(ok_n), f"{lab}: {ok_n if ok_n is not None else 'no count of'} successful requests"
            + ("" if ok_n is not None else f" ({b.missing.get('requests_ok', 'not in the report')})"), lab, ok_n, 1)


def _service_checks(out: _Checks, b: BenchReport, lab: str, slo: SLO, balance_block: bool) -> None:
    """Goodput, SLO attainment, phase balance."""
    if slo.min_goodput_rps is not None:
        g = b.goodput_rps
        ok = g is not None and g >= slo.min_goodput_rps
        out.add("goodput_rps", ok, f"{lab}: goodput {g if g is None else round(g, 3)} req/s "
                f"{'>=' if ok else '<'} {slo.min_goodput_rps}", lab, g, slo.min_goodput_rps)
    if slo.min_slo_attainment is not None:
        a = b.slo_attainment
        ok = a is not None and a >= slo.min_slo_attainment
        out.add("slo_attainment", ok, f"{lab}: SLO attainment {a if a is None else f'{a:.1%}'} "
                f"{'>=' if ok else '<'} {slo.min_slo_attainment:.1%}", lab, a, slo.min_slo_attainment)
    if b.balance:   # phase balance (validation/balance.py): reported; blocks only when asked
        verdict, why = b.balance.get("verdict"), "; ".join(b.balance.get("reasons") or [])
        bound = verdict in ("prefill-bound", "decode-bound")
        out.add("phase_balance", not (bound and balance_block), f"{lab}: {verdict}: {why}" + (
            "" if not bound or balance_block else " (reported, not gated: validation.balance.block is false)"),
            lab, None, "balanced" if balance_block else None)


def _kv_checks(out: _Checks, b: BenchReport, lab: str) -> None:
    """slo.kv_transfer: required: prompt tokens arrived by KV transfer, and no NIXL transfer failed."""
    kv = b.server.kv if b.server is not None else None
    if kv is None:
        err = b.server.error if b.server is not None else None
        out.add("kv_transfer", False, f"{lab}: KV transfer required but no server-side evidence"
                + (f" ({err})" if err else " (run bench with --metrics-url)"), lab)
    elif kv.external_kv_prompt_tokens is None:
        out.add("kv_transfer", False, f"{lab}: KV transfer required but the report has no count of prompt tokens "
                "that arrived by KV transfer", lab, None, ">0")
    else:
        toks = kv.external_kv_prompt_tokens
        seen = b.server.requests_seen if b.server is not None else None
        ok_r = b.server.requests_ok if b.server is not None else None
        partial = (f" (the server's metrics show {seen:.0f} of {ok_r} requests: an engine restarted or its "
                   "metrics are late)" if seen is not None and ok_r is not None and seen < ok_r else "")
        out.add("kv_transfer", toks > 0, f"{lab}: {toks:.0f} prompt tokens arrived by KV transfer"
                + ("" if toks > 0 else partial), lab, toks, ">0")
        nf = kv.nixl_failed_transfers
        out.add("nixl_failures", nf == 0, f"{lab}: {nf:.0f} failed NIXL transfers" if nf is not None
                else f"{lab}: no count of failed NIXL transfers in the report", lab, nf, 0)


def _bench_checks(out: _Checks, b: BenchReport, i: int, slo: SLO, bud: judge.Budget, balance_block: bool) -> None:
    lab = bench_label(b, i)
    if b.stopped_early is not None:   # an interim look found a failure beyond doubt (validation/interim.py)
        se = b.stopped_early
        out.add("stopped_early", False, f"{lab}: {se.reason}", lab, se.after, se.planned)
    _client_check(out, b, lab, slo)
    _latency_checks(out, b, lab, i, slo, bud)
    # exact test on the counts at this check's budget share (validation/error_rates.py); never the summary
    out.items.append(error_rates.tolerance_check(b, lab, slo.max_error_rate, 1 - bud.alpha, 1 - bud.beta))
    if slo.max_error_rate > 0:
        out.items[-1].alpha = bud.alpha
    _service_checks(out, b, lab, slo, balance_block)
    if slo.kv_transfer == "required":
        _kv_checks(out, b, lab)


def _vs_point(out: _Checks, b: BenchReport, s: BenchReport, lab: str, name: str, metric: str, q: float,
              factor: float, why: str) -> None:
    """vs_stable without per-request samples on one side: no interval, so inconclusive (judge.policy);
    the ratio of the reports' own quantiles is what `inconclusive: point_estimate` decides on."""
    qn = f"p{stats.q_name(q)}"
    if metric == "itl_ms":
        (cd, csrc), (sd, ssrc) = itl_source(b), itl_source(s)
        cv, sv = _q(cd, qn), _q(sd, qn)
        src = f" (candidate from {csrc}, stable from {ssrc})"
    else:
        cv, sv, src = _q(getattr(b, metric), qn), _q(getattr(s, metric), qn), ""
    if cv is None or not sv:
        out.add(f"vs_stable_{name}", False, f"{lab}: {name} cannot be compared (candidate {cv}, stable {sv}){src}", lab)
        return
    r = cv / sv
    ok, note = judge.policy("inconclusive", r <= factor, out.st, out.look)
    c = out.add(f"vs_stable_{name}", ok, f"{lab}: {name} {cv:.1f} ms is {r:.2f}x stable {sv:.1f} ms (limit {factor}x)"
                f"{src}: no interval ({why}): inconclusive{note}", lab, r, factor)
    c.verdict = "inconclusive"


def _vs_pair(out: _Checks, b: BenchReport, s: BenchReport, i: int, lab: str, slo: SLO, bud: judge.Budget) -> None:
    """Every vs_stable check of one load against its baseline (judge.vs_baseline), and its errors (Fisher)."""
    vs = slo.vs_stable
    assert vs is not None
    c = error_rates.baseline_check(b, s, lab, 1 - bud.alpha)
    c.alpha = bud.alpha
    out.items.append(c)
    for p in judge.planned_checks(slo):
        if p.kind != "vs_stable":
            continue
        name, metric = p.check.removeprefix("vs_stable_"), str(p.metric)
        q, factor = float(p.q or 0), float(p.limit or 0)
        chunk = "chunk" in (b.itl_level, s.itl_level)   # then both sides use TPOT
        if metric == "tpot_ms" or (metric == "itl_ms" and chunk):
            untimed = [f"{side}: {why}" for side, r in (("candidate", b), ("baseline", s))
                       if (why := judge.tpot_coverage(r))]
            if untimed:   # no interval: the reports' own TPOT quantiles, as for a side without samples
                _vs_point(out, b, s, lab, name, "tpot_ms", q, factor, "; ".join(untimed))
                continue
        cs, ss = judge.request_values(b, metric, chunk), judge.request_values(s, metric, chunk)
        if isinstance(cs, str) or isinstance(ss, str):
            _vs_point(out, b, s, lab, name, metric, q, factor, cs if isinstance(cs, str) else f"stable: {ss}")
            continue
        j = judge.vs_baseline(cs, ss, q, factor, bud, out.st, out.look)
        what = {"ttft_ms": "TTFT", "tpot_ms": "TPOT",
                "itl_ms": "TPOT (chunk-level ITL)" if chunk else "per-request mean ITL"}[metric]
        out.add(f"vs_stable_{name}", j.ok, f"{lab}: {name}: {what} {j.message}", lab,
                j.detectable.get("ratio"), factor, j, i)
    if vs.cost is not None:   # cost gate: computed in validation/cost.py
        from validation.cost import vs_stable_cost
        out.items.append(vs_stable_cost(b, s, vs.cost, lab))


def _vs_stable(out: _Checks, benches: list[BenchReport], invalid: list[list[gate_inputs.Problem]],
               stable: list[BenchReport] | None, baselines: list[BenchReport], slo: SLO,
               bud: judge.Budget, reason: str | None = None) -> list[str]:
    """The comparison with the baseline, per load; returns why loads had no baseline (for `scope`)."""
    vs = slo.vs_stable
    if vs is None:
        return []
    if not stable:
        why = reason or "no baseline run was given (a first release, or no room for a baseline)"
        out.items.append(no_baseline(vs, None, why))
        return [why]
    unproven: list[str] = []
    idx = {_key(s): s for s in baselines}
    for i, b in enumerate(benches):
        if invalid[i]:
            continue
        lab = bench_label(b, i)
        s = idx.get(_key(b))
        if s is None:
            why = (f"no valid baseline run at {load_text(_key(b))} (baseline runs: "
                   + (", ".join(load_text(_key(x)) for x in baselines) or "none valid") + ")"
                   + (f"; {reason}" if reason else ""))
            out.items.append(no_baseline(vs, lab, why))
            unproven.append(f"{lab}: {why}")
            continue
        _vs_pair(out, b, s, i, lab, slo, bud)
    return unproven


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
    check, and the false-rollback budget is split over them (judge.budget). None only for callers with
    no release plan (simulations, scripts/bench_gate_sim.py): then over the runs given.
    `no_baseline_reason`: why no baseline was measured (workflows/pipeline/paired.py), said by vs_stable's
    no-baseline check.
    Reports may be given as the JSON dicts their producers wrote; they are read as models. A report the
    gate cannot judge (validation/gate_inputs.py: null counts, NaN samples, ...) fails `report_input`
    with the field and the fix, and its own checks are not judged."""
    compat = CompatReport.coerce(compat_in) if compat_in is not None else None
    benches = [BenchReport.coerce(b) for b in benches_in]
    stable = [BenchReport.coerce(b) for b in stable_in] if stable_in is not None else None
    out = _Checks(slo.statistics, look)
    bud = judge.budget(slo, judge.load_count(benches, planned))
    _compat_check(out, compat)
    if not benches:
        out.add("bench", False, "no benchmark reports")
    if planned is not None:
        out.items.append(loads_check(benches, planned))
    # each report's input problems, found once: they fail `report_input`, keep the report from judgement,
    # and an invalid baseline is compared with nothing
    invalid = [gate_inputs.problems(b) for b in benches]
    stable_invalid = [gate_inputs.problems(s) for s in stable or []]
    baselines = [s for s, bad in zip(stable or [], stable_invalid, strict=True) if not bad]
    labelled = [(bench_label(b, i), bad) for i, (b, bad) in enumerate(zip(benches, invalid, strict=True))]
    out.items += input_checks(labelled + [(f"baseline {bench_label(s, k)}", bad)
                                          for k, (s, bad) in enumerate(zip(stable or [], stable_invalid, strict=True))])
    golden = GoldenReport.coerce(golden_in) if golden_in is not None else None
    _release_checks(out, golden, diff, skipped, replaced)
    for i, b in enumerate(benches):
        if not invalid[i]:   # else not judged: its report_input checks say why
            _bench_checks(out, b, i, slo, bud, balance_block)
    unproven = _vs_stable(out, benches, invalid, stable, baselines, slo, bud, no_baseline_reason)
    vs = slo.vs_stable
    scope = ("gated on absolute SLOs only: " + "; ".join(unproven)
             if unproven and vs is not None and vs.without_baseline == "absolute_only" else None)
    return Decision.of(out.items, look, out.extend, scope)
