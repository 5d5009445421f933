"""`pdops validate`: judge what a slot serves, with the overlay's own `validation` and `slo`.

The same stage `pdops release` runs after rollout (`steps.validate_slot`), as a command of its own
for the Argo `validate` step (the candidate) and pd-canary (the stable release). Nothing about what
is validated lives in the workflow YAML: compat, every `validation.load`, KV evidence, golden tokens
where the target has a reference, `vs_stable` and the gate all come from release.yaml.
With --slot stable (the canary) the run is one look of many: it is recorded in the target's canary history
of the serving release (keyed by PDOPS_RUN_ID, Argo's workflow uid) and decides across runs
(validation/canary.py): hard failures roll back at once, latency only when its CUSUM crosses the threshold.
Exit codes: 0 promote, 1 rollback or failed (a verdict, never retried), 2 bad input,
75 the target could not be reached (transient: the Argo step retries it).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.cli.common import api_key, emit, open_target, outputs_flag, progress, target_flags
from workflows.targets.base import Progress, Target, TargetError

if TYPE_CHECKING:
    from validation.reports import Decision

HELP = """\
Validates a deployed slot against the overlay's release.yaml and prints the gate's verdict:
  compat       the OpenAI-compatibility suite (validation.compat.optional do not block)
  bench        every validation.load, with the engines' own histograms per phase and KV evidence
  golden       P/D answers equal to a single engine's, where the target provides a reference
  vs_stable    candidate: against the last good release's baseline; stable: against its own
  gate         the slo thresholds -> promote | rollback, with reasons
The run folder (--out, or a new folder under --runs) holds compat/bench JSON and the report.

examples:
  pdops validate --target kubernetes --overlay overlays/dev --namespace llm-dev --out /tmp/run
  pdops validate --slot stable --target kubernetes --overlay overlays/prod --namespace llm-prod
  pdops validate                       the local candidate of overlays/local (after `pdops rollout`)
"""


def cmd_validate(args: argparse.Namespace) -> int:
    from workflows.pipeline import step_outputs
    from workflows.pipeline.steps import RunFolderError, new_run_dir, record_of, validate_slot
    from workflows.render.manifest import render

    say = progress(time.monotonic())
    overlay = Path(args.overlay)
    # The spec, and the digest of what the overlay renders. Without Ray's models (validate_serve_config):
    # validate applies nothing it renders, and what it measures was validated by them before it was applied
    # (check and rollout); the render is the same either way. Importing them is 11-14 s of CPU per pod
    # (2026-12-07: `pdops render overlays/dev` 12.5 s user with no render cache, 1.0 s with it).
    rendered = render(overlay, validate_serve_config=False)
    assert rendered.spec is not None
    digest = record_of(rendered, "").digest if args.slot == "candidate" else None
    # the stable slot (the canary) is judged by the spec recorded with the serving release, never the
    # branch head's; --spec-from-overlay is the explicit way to judge a release that recorded none
    spec = rendered.spec if args.slot == "candidate" or args.spec_from_overlay else None
    if args.out:
        run = Path(args.out)
        run.mkdir(parents=True, exist_ok=True)
    else:
        run = new_run_dir(Path(args.runs), overlay.name)
    say(f"[validate] {args.slot} of {overlay} on the {args.target} target; run folder {run}")
    target = open_target(args)
    try:
        # it writes (reference and baseline RayServices, the golden cache): under the lock, as every writer
        with target.session():
            result = validate_slot(target, spec, run, say, slot=args.slot, digest=digest,
                                   api_key=api_key(), rendered=rendered)   # rendered: each run is priced on its nodes
            if args.slot == "stable":   # the canary: one look of many, decided across runs (validation/canary.py)
                result.decision = _across_runs(target, result.decision, run, say)
    except TargetError as exc:
        if exc.transient:
            raise
        reasons = [exc.problem, *exc.details]
    except RunFolderError as exc:
        reasons = [f"validation could not record its results: {exc}"]
    else:
        decision = result.decision
        try:   # which release was judged: `rollback --to-previous --report RUN` regresses that one only
            (run / "validated.json").write_text(json.dumps({"slot": args.slot, "release": result.release}),
                                                encoding="utf-8")
        except OSError as exc:
            say(f"[validate] cannot write {run / 'validated.json'}: {exc.strerror or exc}")
        summary = (run / "summary.md").read_text(encoding="utf-8") if (run / "summary.md").is_file() else \
            step_outputs.lines(decision.verdict, decision.reasons)
        step_outputs.write(args.outputs, decision.verdict, summary, result.benches)
        lines = [f"{decision.verdict.upper()}: {result.release} ({decision.passed} checks passed, "
                 f"{decision.failed} failed)", *(f"  - {r}" for r in decision.reasons[:12]),
                 f"report: {result.report.markdown}"]
        emit(args, {"verdict": decision.verdict, "release": result.release, "reasons": decision.reasons,
                     "run": str(run), "report": result.report.json_data()}, "\n".join(lines))
        return 0 if decision.verdict == "promote" else 1
    step_outputs.write(args.outputs, "failed", step_outputs.lines(f"failed: validation of the {args.slot}", reasons))
    emit(args, {"verdict": "failed", "reasons": reasons, "run": str(run)},
          "FAILED: " + reasons[0] + "".join(f"\n  - {r}" for r in reasons[1:]))
    return 1


def _across_runs(target: Target, decision: Decision, run: Path, say: Progress) -> Decision:
    """The stable slot's verdict across runs: hard failures at once, latency on the CUSUM; its lines
    lead the reasons (and so the summary pd-canary's alert prints)."""
    from workflows.pipeline.canary import judge_canary

    verdict = judge_canary(target, decision, run, say)
    reasons = verdict.reasons or ["no hard failure and no latency CUSUM over its threshold"]
    try:
        with (run / "summary.md").open("a", encoding="utf-8") as f:
            f.write("\n## Canary across runs\n\n" + "".join(f"- {line}\n" for line in [*reasons, *verdict.lines]))
    except OSError as exc:
        say(f"[canary] cannot write {run / 'summary.md'}: {exc.strerror or exc}")
    return decision.model_copy(update={"verdict": "rollback" if verdict.act else "promote",
                                       "reasons": [*reasons, *verdict.lines]})


def register(sub) -> None:
    p = sub.add_parser("validate", help="judge a deployed slot with the overlay's validation and SLOs (the Argo step)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    target_flags(p, overlay=True)
    p.add_argument("--slot", choices=("candidate", "stable"), default="candidate",
                   help="candidate (a release; default) or stable (the canary)")
    p.add_argument("--spec-from-overlay", action="store_true",
                   help="stable slot: judge it by the overlay's release.yaml instead of the spec recorded with "
                        "the serving release (only for a release recorded before pdops kept specs; check the "
                        "overlay out at that release's revision first)")
    p.add_argument("--out", help="run folder to write (created; default: a new folder under --runs)")
    p.add_argument("--runs", default="runs", help="where new run folders go (default runs/)")
    outputs_flag(p)
    p.set_defaults(func=cmd_validate)
