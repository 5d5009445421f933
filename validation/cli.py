"""`pdops compat`, `pdops bench`, `pdops gate`: registered into the main CLI by register(sub)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validation.cli_args import (
    count as _count,
    err as _err,
    http_url as _http_url,
    nonnegative as _nonnegative,
    output_dir as _output_dir,
    output_file as _output_file,
    positive as _positive,
    positive_int as _positive_int,
    write_json as _write_json,
)
from validation.errors import InputError
from validation.release_inputs import ReleaseReader

if TYPE_CHECKING:
    from validation.reports.bench import BenchReport


# The argument types and output helpers are shared with `pdops diff` (validation/diff/command.py),
# which sits below this module: they live in validation/cli_args.py, named locally as before.


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


# ---- compat ---------------------------------------------------------------------------------
def cmd_compat(args) -> int:
    from validation import compat
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        _err(f"warning: ${args.api_key_env} is empty")
    optional = [s for s in (args.optional or "").split(",") if s]
    only = [s for s in (args.only or "").split(",") if s] or None
    unknown = [o for o in optional + (only or []) if o not in compat.CASES]
    if unknown:
        _err(f"unknown compat case(s): {', '.join(unknown)}; known: {', '.join(compat.CASES)}")
        return 2
    res = compat.run(args.base_url, args.model, api_key=api_key, optional=optional,
                     api_key_required=args.api_key_required or bool(api_key), only=only, progress=_err)
    print(compat.table(res))
    _write_json(args.json, res)
    return 0 if res.ok else 1


# ---- bench ----------------------------------------------------------------------------------
def cmd_bench(args) -> int:
    from validation import profiles
    from validation.bench import BenchConfig, run_bench
    if args.profile:
        try:
            prof = profiles.get(args.profile)
        except KeyError as e:
            _err(str(e.args[0]))
            return 2
    elif args.prompt_tokens and args.output_tokens:
        prof = profiles.custom(args.prompt_tokens, args.output_tokens)
    else:
        _err("need --profile or both --prompt-tokens and --output-tokens")
        return 2
    if args.requests is None and args.duration is None:
        args.requests = 32
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    res = run_bench(BenchConfig(
        args.base_url, args.model, prof, concurrency=args.concurrency, rate=args.rate, poisson=args.poisson,
        requests=args.requests, duration=args.duration, warmup=args.warmup, ramp_s=args.ramp_s,
        api_key=api_key, endpoint=args.endpoint, seed=args.seed, tokenizer=args.tokenizer,
        workers=args.workers, progress=_err, metrics_url=args.metrics_url, metrics_lag_s=args.metrics_lag_s,
        goodput_ttft_ms=args.goodput_ttft_ms, goodput_tpot_ms=args.goodput_tpot_ms))
    _print_latencies(res, args)
    _print_outcome(res)
    _write_json(args.json, res)
    if not res.requests_ok:
        return 1
    return 0


def _print_latencies(res: BenchReport, args) -> None:
    """The run's load, the client's latency quantiles, chunking, and client beside server per phase."""
    from validation.reports.bench import Quantiles
    from validation.server_metrics import side_by_side
    print(f"profile {res.profile}  load {res.load.mode} "
          f"{'c=' + str(args.concurrency) if args.concurrency else f'rate={args.rate}/s'}  "
          f"ok {res.requests_ok}  errors {res.errors}  wall {_fmt(res.wall_s)}s")
    print(f"{'metric':8} {'mean':>8} {'p50':>8} {'p90':>8} {'p95':>8} {'p99':>8} {'max':>8}  (ms)")
    for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        s = getattr(res, k) or Quantiles()
        qs = ("mean", "p50", "p90", "p95", "p99", "max")
        print(f"{k[:-3]:8} " + " ".join(f"{_fmt(getattr(s, q)):>8}" for q in qs))
    tpc = res.tokens_per_chunk.mean if res.tokens_per_chunk else None
    chunk_note = ("  -> ITL above is CHUNK-level (the server batches its stream); use TPOT and the server's ITL "
                  "histogram" if res.itl_level == "chunk" else "")
    print(f"tokens per chunk {_fmt(tpc)}" + chunk_note)
    rows = side_by_side(res)
    for r in rows:
        print(f"{r['phase']:8} client p50/p90/p99 " + "/".join(_fmt(r[f"client_{q}"]) for q in ("p50", "p90", "p99"))
              + "  server " + "/".join(_fmt(r[f"server_{q}"]) for q in ("p50", "p90", "p99")) + f"  ({r['metric']})")


def _print_outcome(res: BenchReport) -> None:
    """Throughput and goodput, the client's health, prompt lengths, the server's KV transfer, the
    phase balance and the errors."""
    num = lambda v, spec: "-" if v is None else format(v, spec)   # noqa: E731
    print(f"throughput {num(res.request_throughput_rps, '.2f')} req/s, {num(res.output_token_throughput_tps, '.1f')} "
          f"tok/s; goodput {num(res.goodput_rps, '.2f')} req/s (attainment {num(res.slo_attainment, '.1%')})")
    ch = res.client_health
    lag = ch.loop_lag_ms.p99 if ch.loop_lag_ms else None
    cpu = ch.cpu_percent.mean if ch.cpu_percent else None
    starved = ch.starved()
    print(f"client: loop lag p99 {num(lag, '.1f')} ms, CPU mean {num(cpu, '.0f')}%"
          + (f"  CLIENT BOTTLENECK: {starved}" if starved is not None else ""))
    ln = res.lengths
    if ln is not None:
        print(f"prompt tokens served/requested {ln.prompt_ratio_mean:.2f}x ({ln.prompts_from})"
              if ln.prompt_ratio_mean is not None else f"prompt lengths unverified: no usage ({ln.prompts_from})")
        if ln.output_mismatches or ln.prompt_mismatch:
            print(f"length mismatch: {ln.model_dump(mode='json')}")
    if res.server is not None:
        kv = res.server.kv
        print(f"server: {res.server.error or ''}"
              + (f"kv tokens {num(kv.external_kv_prompt_tokens, '.0f')}, nixl failures "
                 f"{num(kv.nixl_failed_transfers, '.0f')}" if kv else ""))
    if res.balance:   # the phases' queues (validation/balance.py); pdops advise takes this file
        print(f"phase balance: {res.balance.get('verdict')}: " + "; ".join(res.balance.get("reasons") or []))
    if res.errors:
        print("errors: " + "; ".join(res.error_samples))


# ---- gate -----------------------------------------------------------------------------------
def _load(path: str) -> dict | list:
    """A JSON report named on the command line; anything else is bad input naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "", "file not found", "pass a file written by `pdops compat/bench --json`") from None
    except OSError as exc:
        raise InputError(path, "", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"line {exc.lineno}, column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(path, "", "invalid JSON: nested too deeply") from None
    if not isinstance(data, (dict, list)):
        raise InputError(path, "", f"expected a JSON object or list, got {type(data).__name__}")
    return data


def _benches_of(obj: dict[str, Any] | list[Any], path: str) -> list[BenchReport]:
    """The bench reports of a file: one, a list, or a run's report.json; read as BenchReport, so a
    file of another shape is bad input naming the file and the first field that does not fit."""
    from pydantic import ValidationError

    from validation.reports.bench import BenchReport

    if isinstance(obj, list):
        benches = obj
    elif obj.get("kind") == "bench":
        benches = [obj]
    else:
        benches = obj.get("benches", [])
    if not isinstance(benches, list) or not all(isinstance(b, dict) for b in benches):
        raise InputError(path, "", "expected a bench report (JSON object), a list of them, or {\"benches\": [...]}")
    try:
        return [BenchReport.model_validate(b) for b in benches]
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(path, "", f"not reports `pdops compat/bench --json` wrote: {'.'.join(map(str, e['loc']))}: "
                         f"{e['msg']}", "pass the files those commands wrote") from None


def _refuse_unjudgeable(path: str, benches: list[BenchReport]) -> None:
    """Bad input (exit 2), never a verdict: a report the gate cannot judge (validation/gate_inputs.py)
    names its file, the field (`[i].` its place in a list of several) and the fix."""
    from validation.gate_inputs import problems

    found = [(i, p) for i, b in enumerate(benches) for p in problems(b)]
    if found:
        i, first = found[0]
        more = f" (and {len(found) - 1} more: " + "; ".join(
            (f"[{j}]." if len(benches) > 1 else "") + p.field for j, p in found[1:6]) + ")" if len(found) > 1 else ""
        raise InputError(path, (f"[{i}]." if len(benches) > 1 else "") + first.field, first.problem + more, first.fix)


def _reader(args) -> ReleaseReader:
    read = getattr(args, "read_release", None)
    if read is None:
        raise InputError("command line", "--release", "this entry point reads no release.yaml",
                         "run the command as `pdops` (workflows/cli/main.py), which reads the release spec")
    return read


def cmd_gate(args) -> int:
    from validation import gate, report
    from validation.reports.compat import CompatReport
    release = Path(args.release)
    read = _reader(args)
    try:
        spec = read(release)   # ReleaseInputs: the release's slo, validation and pricing
        slo = spec.slo
    except Exception as e:  # noqa: BLE001
        _err(f"cannot load release spec from {release.parent}: {e}")
        return 2
    raw_compat = _load(args.compat) if args.compat else None
    if raw_compat is not None and not isinstance(raw_compat, dict):
        raise InputError(args.compat, "", "expected the JSON object `pdops compat --json` writes, got a list")
    given = [(f, _benches_of(_load(f), f)) for f in args.bench]
    stable = _benches_of(_load(args.stable_report), args.stable_report) if args.stable_report else None
    for path, found in given + ([(args.stable_report, stable)] if stable is not None else []):
        _refuse_unjudgeable(path, found)
    benches = [b for _, found in given for b in found]
    if args.inconclusive:
        slo = slo.model_copy(update={"statistics": slo.statistics.model_copy(
            update={"inconclusive": args.inconclusive, "max_looks": 1})})
    try:
        unpriced = spec.price(benches)   # $ per run on the overlay's nodes (workflows/pipeline/pricing.py add_costs)
        if unpriced:
            _err(unpriced)
        # one run of each load is all this command has: with inconclusive: extend it judges the
        # last planned look (the confidence is already corrected for max_looks), so unproven fails
        compat = CompatReport.model_validate(raw_compat) if raw_compat is not None else None
        decision = gate.decide(compat, benches, slo, stable, look=slo.statistics.max_looks,
                               balance_block=spec.validation.balance.block, planned=spec.validation.load)
        files = report.write(args.out, decision, compat, benches)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:   # JSON, but not a report's shape
        named = [f for f in (args.compat, *args.bench, args.stable_report) if f]
        raise InputError(", ".join(named), "", f"not reports `pdops compat/bench --json` wrote: "
                         f"{type(exc).__name__}: {exc}", "pass the files those commands wrote") from None
    print(f"verdict: {decision.verdict}")
    for r in decision.reasons:
        print(f"  - {r}")
    _err(f"report: {files.markdown}")
    if args.json:
        _write_json(args.json, decision)
    return 0 if decision.verdict == "promote" else 1


def cmd_plan_load(args) -> int:
    """Block pairs each load needs, from a pilot run's block-level spread (validation/plan.py)."""
    from validation import judge, plan
    from validation.config import SLO, Statistics, VsStable
    from validation.gate import bench_label

    release = _reader(args)(Path(args.release)) if args.release else None
    slo = release.slo if release is not None else SLO(vs_stable=VsStable(ttft_p90=1.1, tpot_p90=1.1, itl_p90=1.1))
    if slo.vs_stable is None:
        slo = slo.model_copy(update={"vs_stable": VsStable(ttft_p90=1.1, tpot_p90=1.1, itl_p90=1.1)})
    over = {k: v for k, v in (("false_rollback", args.false_rollback), ("missed_regression", args.missed_regression))
            if v}
    if over:
        from pydantic import ValidationError
        try:
            slo = slo.model_copy(update={"statistics": Statistics.model_validate(
                {**slo.statistics.model_dump(), **over})})
        except ValidationError as exc:
            e = exc.errors()[0]
            raise InputError("command line", "--" + str(e["loc"][0]).replace("_", "-"), e["msg"],
                             "use a rate in (0, 0.5]") from None
    loads = len(release.validation.load) if release is not None else 1
    bud = judge.budget(slo, loads)
    vs_checks = [p for p in judge.planned_checks(slo) if p.kind == "vs_stable"]
    assert slo.vs_stable is not None
    print(f"regression to catch +{args.regression:.0%} with {1 - bud.beta:.0%}; {bud.checks} planned checks over "
          f"{loads} load(s) (judge.planned_checks), each failing at most alpha {bud.alpha:.3%} "
          f"(false_rollback {bud.false_rollback:.0%} for the whole decision)")
    rc = 1
    for i, b in enumerate(_benches_of(_load(args.pilot), args.pilot)):
        print(f"\npilot {bench_label(b, i)}: {b.requests_ok} requests")
        print("| check | pair sd of log quantile | pilot blocks (requests each) | block pairs needed "
              f"| requests/side | caught at {slo.vs_stable.blocks} pairs |")
        print("| --- | --- | --- | --- | --- | --- |")
        needs = []
        for p in vs_checks:
            got = judge.request_values(b, str(p.metric))
            try:
                sp = plan.block_spread(*got, float(p.q or 0)) if not isinstance(got, str) else got
            except ValueError as exc:
                sp = str(exc)
            if isinstance(sp, str):
                print(f"| {p.check} | – | {sp} | – | – | – |")
                continue
            k = plan.blocks_needed(sp, float(p.limit or 0), args.regression, bud.alpha, bud.beta)
            now = plan.caught_at(sp, slo.vs_stable.blocks, float(p.limit or 0), bud.alpha, bud.beta)
            print(f"| {p.check} ({p.limit}x) | {sp.pair_sd:.3f} | {sp.blocks} {'batches' if sp.batches else 'blocks'}"
                  f" ({sp.per_block}) | {k if k else 'none: regression within the factor'} | "
                  f"{k * sp.per_block if k else '–'} | {now:.3f}x |")
            needs.append((k or 0) * sp.per_block)
            rc = 0
        if needs and b.wall_s and b.requests_total:
            per = b.wall_s / b.requests_total
            wall, gpu_min = plan.gpu_minutes(max(needs), per, args.gpus)
            print(f"cost: {max(needs)} requests per side at {per:.2f} s each: {wall:.0f} min of load, "
                  f"{gpu_min:.0f} GPU-minutes per load at {args.gpus} GPUs per deployment (candidate and "
                  f"baseline both held), {gpu_min * loads:.0f} per release of {loads} load(s)")
    if rc:
        _err("no per-request samples in the pilot: run `pdops bench` (it keeps them) and pass its --json file")
    return rc


def register(sub, read_release: ReleaseReader | None = None) -> None:
    """The commands of validation/; `read_release` reads a release.yaml for gate and plan-load."""
    _register_plan_load(sub, read_release)
    _register_compat(sub)
    _register_bench(sub)
    _register_gate(sub, read_release)
    from validation.diff.command import register as register_diff  # `pdops diff` (validation/diff/)
    register_diff(sub)
    from validation.reports.schema import register as register_schema  # `pdops schema` (validation/schemas/)
    register_schema(sub)


def _register_plan_load(sub, read_release: ReleaseReader | None) -> None:
    p = sub.add_parser("plan-load", help="block pairs a load needs to catch a regression, from a pilot bench JSON")
    p.add_argument("pilot", help="a bench JSON (`pdops bench --json`; interleaved: with blocks) or a report.json")
    p.add_argument("--release", help="overlays/<env>/release.yaml: its checks, loads and slo.statistics")
    p.add_argument("--regression", type=_positive, default=0.15, help="fraction, e.g. 0.15 for +15%%")
    p.add_argument("--false-rollback", type=_positive, help="override slo.statistics.false_rollback")
    p.add_argument("--missed-regression", type=_positive, help="override slo.statistics.missed_regression")
    p.add_argument("--gpus", type=int, default=16, help="GPUs per deployment, for the cost line (default 16)")
    p.set_defaults(func=cmd_plan_load, read_release=read_release)


def _register_compat(sub) -> None:
    p = sub.add_parser("compat", help="OpenAI-compatibility suite against a serving endpoint")
    p.add_argument("--base-url", required=True, type=_http_url, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key-env", help="environment variable holding the API key")
    p.add_argument("--api-key-required", action="store_true", help="also check that a wrong key gets 401")
    p.add_argument("--optional", default="", help="comma-separated cases that do not block")
    p.add_argument("--only", default="", help="comma-separated cases to run")
    p.add_argument("--json", type=_output_file, help="write result JSON here")
    p.set_defaults(func=cmd_compat)


def _register_bench(sub) -> None:
    p = sub.add_parser("bench", help="streaming latency benchmark (TTFT, ITL, TPOT, goodput)")
    p.add_argument("--base-url", required=True, type=_http_url)
    p.add_argument("--model", required=True)
    p.add_argument("--profile", help="long-prompt-short-output | short-prompt-long-output | balanced")
    p.add_argument("--prompt-tokens", type=_positive_int)
    p.add_argument("--output-tokens", type=_positive_int)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--concurrency", type=_positive_int, help="closed loop with this many in flight")
    g.add_argument("--rate", type=_positive, help="open loop at this many requests/s")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals for --rate")
    p.add_argument("--ramp-s", type=_nonnegative, default=0.0,
                   help="the load rises over this many seconds instead of starting as a burst")
    p.add_argument("--requests", type=_positive_int)
    p.add_argument("--duration", type=_positive, help="seconds")
    p.add_argument("--warmup", type=_count, default=0)
    p.add_argument("--metrics-url", type=_http_url, help="Prometheus endpoint to scrape before/after")
    p.add_argument("--metrics-lag-s", type=_nonnegative, default=0.0,
                   help="how stale --metrics-url can be: waited out before the first scrape, and the last "
                        "scrape is retried until every request shows (Ray exports every 10 s: use 10)")
    p.add_argument("--api-key-env")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--goodput-ttft-ms", type=_positive)
    p.add_argument("--goodput-tpot-ms", type=_positive)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=_positive_int, default=1, help="client processes sharing the load")
    p.add_argument("--tokenizer", help="local HF tokenizer directory of the served model: exact prompt lengths "
                   "(default: one word per token)")
    p.add_argument("--json", type=_output_file, help="write result JSON here")
    p.set_defaults(func=cmd_bench)


def _register_gate(sub, read_release: ReleaseReader | None) -> None:
    p = sub.add_parser("gate", help="decide promote/rollback from compat + bench reports")
    p.add_argument("--compat", help="compat result JSON")
    p.add_argument("--bench", nargs="+", required=True, help="bench JSON file(s)")
    p.add_argument("--release", required=True, help="overlays/<env>/release.yaml")
    p.add_argument("--stable-report", help="stable release's bench/report JSON")
    p.add_argument("--out", required=True, type=_output_dir, help="report directory")
    p.add_argument("--json", type=_output_file, help="also write the decision JSON here")
    p.add_argument("--inconclusive", choices=("fail", "point_estimate"),
                   help="override slo.statistics.inconclusive (pd-canary: point_estimate, so a 16-request "
                        "check of the stable release acts only on what it measured)")
    p.set_defaults(func=cmd_gate, read_release=read_release)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdops-validation")
    register(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
