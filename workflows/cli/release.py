"""`pdops release | rollout | promote | rollback | status | down`: the commands that act on a target.

The same commands run by hand, in CI and as Argo steps (`--target kubernetes`). Progress goes to
stderr as it happens; the result goes to stdout (readable, or JSON with --json).
Exit codes: 0 promoted / done / unchanged, 1 rolled back or failed, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.cli.common import (
    api_key as _api_key,
    emit as _emit,
    open_target,
    outputs_flag,
    progress as _progress,
    target_flags,
    timeouts_of,
)
from workflows.errors import InputError
from workflows.targets.base import TargetError, TargetStatus

if TYPE_CHECKING:
    pass

RELEASE_HELP = """\
Runs the whole pipeline on one overlay:
  1 build-config  release.yaml -> Ray Serve LLM P/D config, validated by Ray's own models
  2 check         kustomize render, cross-layer rules, pinned schemas (nothing applied on findings)
  3 rollout       the candidate slot, beside the stable one, until Serve reports it RUNNING
  4 validate      OpenAI-compatibility suite, the release's latency loads (TTFT prefill+KV,
                  ITL/TPOT decode, server histograms, KV-transfer evidence), golden tokens equal
                  to a single-engine reference, then the SLO gate from release.yaml
  5 promote       the candidate takes the stable route, or rollback: it is removed, stable untouched
Reports (JSON, Markdown, PNG) land in a run folder whose path is printed first and last.

examples:
  pdops release                               the embedded default: overlays/local on this machine
  pdops release --overlay overlays/local --json
  pdops status                                what is stable, what is pending, the last good release
  pdops rollback                              restore the last good release (e.g. after a crash)
"""


def _refuse_local_dry_run(args: argparse.Namespace) -> None:
    if args.dry_run and args.target == "local":
        raise InputError("--dry-run", "", "the local target has no dry run",
                         "use `pdops check OVERLAY` to see what would be applied")


def cmd_release(args: argparse.Namespace) -> int:
    from workflows.pipeline.steps import RunFolderError, new_run_dir, release

    say = _progress(time.monotonic())
    overlay = Path(args.overlay)
    if not (overlay / "kustomization.yaml").is_file():
        raise InputError(overlay, "", "not an overlay directory (no kustomization.yaml)", "pass e.g. overlays/local")
    run = new_run_dir(Path(args.runs), overlay.name)
    say(f"[release] {overlay} -> {args.target} target; run folder {run}")
    target = open_target(args)
    try:
        out = release(overlay, target, run, say, revision=args.revision, ready_timeout_s=args.timeout,
                      api_key=_api_key())
    except (TargetError, RunFolderError) as exc:  # before apply (nothing deployed) or in the target
        say(f"[release] failed: {exc}")
        print(f"FAILED: {str(exc).splitlines()[0]}\nrun folder: {run}")
        return 1
    verdict = out.verdict or "failed"
    lines = [f"{verdict.upper()}: {out.release or overlay} in {out.seconds or 0:.0f}s"]
    lines += [f"  - {r}" for r in out.reasons[:12]]
    if out.report is not None:
        lines.append(f"report: {out.report.markdown}")
    lines.append(f"run folder: {run}")
    _emit(args, out.json_data(), "\n".join(lines))
    return 0 if verdict in ("promote", "unchanged") else 1


def cmd_rollout(args: argparse.Namespace) -> int:
    """Argo's rollout step: render + check the overlay, apply it as the candidate, wait until it serves."""
    from workflows.checks.run import blocking, check_rendered
    from workflows.checks.schema import schema_dir_from_env
    from workflows.pipeline import step_outputs
    from workflows.pipeline.steps import record_of, revision_of, settle_candidate
    from workflows.render.manifest import load_release

    say = _progress(time.monotonic())
    rendered = load_release(args.overlay, None)
    errors = blocking(check_rendered(rendered, schema_dir_from_env()))
    if errors:
        for f in errors:
            print(f.render(), file=sys.stderr)
        step_outputs.write(args.outputs, "blocked", step_outputs.lines("blocked: check found problems",
                                                                       [f.render() for f in errors]))
        return 1
    record = record_of(rendered, args.revision or revision_of(Path(args.overlay)))
    target = open_target(args, "rollout")
    _refuse_local_dry_run(args)
    timeout = args.timeout if args.timeout is not None else timeouts_of(args).rollout_s
    try:
        with target.session():
            settled = settle_candidate(target, record, say, dry_run=args.dry_run)
            if settled.unchanged:   # re-release of what serves: the workflow skips validate and promote
                step_outputs.write(args.outputs, "unchanged", step_outputs.lines(
                    f"unchanged: {record.short()} is already stable and serving",
                    [settled.action or "nothing applied"]))
                _emit(args, {"release": record.short(), "unchanged": True, "action": settled.action},
                      f"unchanged: {record.short()} is already stable and serving")
                return 0
            record = target.apply(record, say)
            if args.dry_run:
                step_outputs.write(args.outputs, "dry-run", step_outputs.lines(
                    f"dry run: {record.short()} would roll out",
                    ["the API server admitted every object; nothing stored"]))
                _emit(args, {"dry_run": True, "release": record.short()}, f"dry run: {record.short()} would roll out")
                return 0
            endpoint = target.wait_ready(timeout, say)
    except TargetError as exc:
        if not exc.transient:   # a transient error is retried: the next try writes the outcome
            step_outputs.write(args.outputs, "failed", step_outputs.lines(
                f"failed: rollout of {record.short()}", [exc.problem, *exc.details]))
        raise
    step_outputs.write(args.outputs, "pending", step_outputs.lines(
        f"candidate {record.short()} serves", [f"{record.colour} at {endpoint.base_url}"]))
    _emit(args, {"release": record.short(), "colour": record.colour, "endpoint": endpoint.model_dump()},
          f"candidate {record.short()} ({record.colour}) serves at {endpoint.base_url}")
    return 0


def _reasons(report: str | None) -> list[str]:
    if not report:
        return []
    try:
        from validation.reports.release import RunReport

        return RunReport.model_validate_json((Path(report) / "report.json").read_text()).decision.reasons
    except (OSError, ValueError):   # a missing or unreadable report (ValidationError is a ValueError)
        return []


def _judged(report: str | None) -> str | None:
    """The stable release the --report folder's validation judged (validate_cli writes validated.json):
    what `rollback --to-previous` regresses, so its retry does not regress the release it restored."""
    if not report:
        return None
    try:
        judged = json.loads((Path(report) / "validated.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return judged.get("release") if isinstance(judged, dict) and judged.get("slot") == "stable" else None


def cmd_promote(args: argparse.Namespace) -> int:
    say = _progress(time.monotonic())
    _refuse_local_dry_run(args)
    target = open_target(args, "promote")
    from workflows.pipeline.steps import baseline_of

    with target.session():
        record = target.promote(_reasons(args.report) or ["promoted by hand"], args.report, say,
                                baseline=baseline_of(args.report))
    _emit(args, {"promoted": record.short(), "colour": record.colour}, f"stable is now {record.short()}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    say = _progress(time.monotonic())
    _refuse_local_dry_run(args)
    target = open_target(args, "rollback")
    with target.session():
        if args.if_candidate_pending and target.status().candidate.release is None:
            _emit(args, {"action": "none"}, "no candidate pending: nothing to roll back")
            return 0
        regressed = args.regressed or (_judged(args.report) if args.to_previous else None)
        action = target.rollback(_reasons(args.report) or [args.reason], args.report, say,
                                 to_previous=args.to_previous, regressed=regressed)
    from workflows.pipeline import step_outputs

    step_outputs.write(args.outputs, "rolled-back", step_outputs.lines("rolled back", [args.reason, action]))
    _emit(args, {"action": action}, action)
    return 0


def _status_text(st: TargetStatus, history: list) -> str:
    lines = [f"target: {st.target}"]
    for slot in (st.stable, st.candidate):
        if slot.release is None:
            lines.append(f"{slot.slot:9}  -")
            continue
        where = f"  {slot.endpoint.base_url}" if slot.endpoint else ""
        lines.append(f"{slot.slot:9}  {slot.release.short()} [{slot.release.colour}] {slot.state}{where}"
                     + (f"  ({slot.detail[:120]})" if slot.detail else ""))
    lines.append(f"last good  {st.last_good.short() if st.last_good else '-'}")
    lines += [f"leftover   {what}" for what in st.leftovers]
    if history:
        lines.append("history (newest first):")
        for r in reversed(history[-8:]):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.decided_at or r.applied_at))
            lines.append(f"  {when}  {r.verdict:9}  {r.short()}  {(r.reasons or [''])[0].split(chr(10))[0][:90]}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    target = open_target(args)
    st, history = target.status(), target.history()
    strip = {"manifest"}
    data = st.model_dump(exclude={"stable": {"release": strip}, "candidate": {"release": strip}, "last_good": strip})
    data["history"] = [r.model_dump(exclude=strip) for r in history]
    _emit(args, data, _status_text(st, history))
    return 0


def cmd_endpoint(args: argparse.Namespace) -> int:
    """Where validation reaches a slot; with --out, one file per value (Argo output parameters)."""
    endpoint = open_target(args).endpoint(args.slot)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "base-url").write_text(endpoint.base_url, encoding="utf-8")
        (out / "metrics-url").write_text(endpoint.metrics_url or "", encoding="utf-8")
    _emit(args, endpoint.model_dump(), f"{args.slot}: {endpoint.base_url}  metrics: {endpoint.metrics_url or '-'}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from workflows.targets.local import LocalTarget

    stopped = LocalTarget().down(_progress(time.monotonic()))
    print("stopped the local stack (slots and history kept; `pdops rollback` or a release brings stable back)"
          if stopped else "the local stack is not running")
    return 0


def register(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("release", help="the whole pipeline on one overlay: check, rollout, validate, promote|rollback",
                       description=RELEASE_HELP, formatter_class=fmt)
    target_flags(p, overlay=True)
    p.add_argument("--revision", help="git revision to record (default: HEAD of the overlay's repo, -dirty if edited)")
    p.add_argument("--runs", default="runs", help="where run folders go (default runs/)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the candidate (default: release.yaml timeouts.rollout_s)")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("rollout", help="(step) render+check an overlay, deploy it as the candidate, wait until ready")
    target_flags(p, overlay=True)
    p.add_argument("--revision", help="git revision to record")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the candidate (default: the overlay's timeouts.rollout_s)")
    outputs_flag(p)
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("promote", help="(step) the candidate takes the stable name; recorded as the last good release")
    target_flags(p, overlay=True)
    p.add_argument("--report", help="the gate's report folder (its reasons go into the history)")
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("rollback", help="drop a pending candidate and make sure stable serves the last good release")
    target_flags(p, overlay=True)
    p.add_argument("--if-candidate-pending", action="store_true",
                   help="do nothing unless a candidate is pending (Argo's exit handler)")
    p.add_argument("--to-previous", action="store_true",
                   help="the stable release regressed: mark it so and restore the good release before it")
    p.add_argument("--regressed", metavar="RELEASE",
                   help="with --to-previous: the release found regressed (digest or its 12 characters); a retry "
                        "after it was replaced changes nothing (default: the one the --report folder judged)")
    p.add_argument("--report", help="the gate's report folder (its reasons go into the history)")
    p.add_argument("--reason", default="rolled back by hand", help="why, for the history")
    outputs_flag(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("status", help="what is stable, what is pending, the last good release and the history")
    target_flags(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("endpoint", help="(step) how validation reaches a slot: base URL and metrics URL")
    target_flags(p)
    p.add_argument("--slot", choices=("stable", "candidate"), default="candidate")
    p.add_argument("--out", help="also write base-url and metrics-url files into this directory")
    p.set_defaults(func=cmd_endpoint)

    p = sub.add_parser("down", help="stop the local stack pdops started (slots and history stay on disk)")
    p.set_defaults(func=cmd_down)
