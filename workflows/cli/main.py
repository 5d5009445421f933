"""`pdops`: one entry point for people, CI and the Argo steps. Thin: parses, calls steps, prints."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from workflows.errors import InputError, MissingDependency
from workflows.targets.base import EXIT_TRANSIENT, TargetError

EPILOG = """\
The main job, end to end on this machine (Ray + vLLM CPU + a tiny local model):
  pdops release                        check, roll out a candidate, validate, promote or roll back
  pdops status / rollback / down       what serves; restore the last good release; stop the stack

The flow of a release, one command per stage:
  pdops render overlays/local          the full manifest, serve config in spec.serveConfigV2
  pdops check overlays/prod            what is wrong, before anything reaches a cluster
  pdops check -f rendered.yaml --json  the same for an already rendered manifest, for machines
  pdops build-config overlays/dev      the Ray Serve LLM application config alone

Exit codes: 0 ok / promoted, 1 findings / rolled back / target failure, 2 bad input or usage,
            75 the target could not be reached or answered 5xx (transient: the Argo steps retry it).
Settings: PDOPS_SCHEMA_DIR (other copies of the CRD/JSON schemas; default: the pinned ones in workflows/data/schemas).
"""


def _schema_dir(args: argparse.Namespace) -> Path:
    from workflows.checks.schema import schema_dir_from_env

    return Path(args.schema_dir) if args.schema_dir else schema_dir_from_env()


def _print_findings(findings, stream) -> None:
    for f in findings:
        print(f.render(), file=stream)


def cmd_render(args: argparse.Namespace) -> int:
    from workflows.checks.run import blocking, check_rendered
    from workflows.render.manifest import load_release

    rendered = load_release(args.overlay, None)
    findings = check_rendered(rendered, _schema_dir(args))
    from workflows.pipeline import step_outputs

    if blocking(findings):
        _print_findings(findings, sys.stderr)
        print(f"render: {len(blocking(findings))} finding(s); nothing written", file=sys.stderr)
        step_outputs.write(args.outputs, "blocked", step_outputs.lines(
            f"blocked: {len(blocking(findings))} finding(s) in {args.overlay}",
            [f.render() for f in blocking(findings)]))
        return 1
    step_outputs.write(args.outputs, "checked", step_outputs.lines(
        f"checked: {args.overlay}", [f"{len(rendered.objects)} objects, no blocking finding"]
        + [f.render() for f in findings if f.severity == "warning"]))
    text = rendered.text()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(rendered.objects)} objects)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_check_changed(args: argparse.Namespace) -> int:
    """`check --changed FILE...`: every overlay those files affect (workflows/render/changed.py); the worst exit."""
    from workflows.render.changed import affected_overlays

    if args.overlay or args.file:
        raise InputError("", "check --changed", "takes changed files, not an overlay or -f FILE",
                         "pass either an overlay or --changed FILE...")
    overlays = affected_overlays(args.changed)
    if not overlays:
        print(f"no overlay is affected by the {len(args.changed)} changed file(s)")
    code = 0
    for overlay in overlays:
        try:
            code = max(code, cmd_check(argparse.Namespace(**{**vars(args), "overlay": str(overlay), "changed": None})))
        except InputError as exc:   # one broken overlay: still check the others
            print(f"error: {exc.render()}", file=sys.stderr)
            code = 2
    return code


def cmd_check(args: argparse.Namespace) -> int:
    from workflows.checks.run import blocking, check_rendered
    from workflows.render.manifest import load_release

    if getattr(args, "changed", None) is not None:
        return cmd_check_changed(args)
    started = time.perf_counter()
    rendered = load_release(args.overlay, args.file)
    findings = check_rendered(rendered, _schema_dir(args))
    errors = blocking(findings)
    if args.json:
        json.dump({"source": rendered.file, "clean": not errors, "findings": [f.to_dict() for f in findings]},
                  sys.stdout, indent=2)
        print()
    else:
        _print_findings(findings, sys.stdout)
        took = time.perf_counter() - started
        verdict = "clean" if not errors else f"{len(errors)} error(s)"
        print(f"{rendered.file}: {len(rendered.objects)} objects checked, {verdict} ({took:.1f}s)")
    return 1 if errors else 0


def cmd_build_config(args: argparse.Namespace) -> int:
    from workflows.pipeline.steps import build_config
    from workflows.render.manifest import dump_yaml

    config = build_config(Path(args.overlay))
    sys.stdout.write(json.dumps(config, indent=2) + "\n" if args.json else dump_yaml(config))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from workflows.cli.doctor import diagnose

    problems = 0
    for name, ok, detail in diagnose(install_only=args.install or args.steps, steps=args.steps):
        problems += not ok
        if not (args.quiet and ok):
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return 1 if problems else 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from workflows.spec.tiny_model import build, model_dir

    cached = (model_dir(args.name) / "config.json").exists()
    if not cached:
        print(f"building tiny model {args.name} (about 10 s)...", file=sys.stderr)
    print(build(args.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdops", description="Prove every disaggregated prefill/decode release before users see it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def schema_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--schema-dir",
                       help="folder of CRD/JSON schemas (default: $PDOPS_SCHEMA_DIR, "
                       "else the pinned workflows/data/schemas)")

    p = sub.add_parser("render", help="overlay -> deployable multi-document YAML (checked first)")
    p.add_argument("overlay", help="overlay directory, e.g. overlays/local")
    p.add_argument("-o", "--output", help="write to FILE instead of stdout")
    p.add_argument("--outputs", metavar="DIR",
                   help="(Argo steps) also write verdict (checked|blocked) and summary, one file each, into DIR")
    schema_flag(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="cross-layer lint + pinned-schema validation; exit 0 only when clean")
    p.add_argument("overlay", nargs="?", help="overlay directory (or a rendered manifest file)")
    p.add_argument("-f", "--file", help="a rendered manifest file, '-' for stdin")
    p.add_argument("--json", action="store_true", help="machine-readable findings on stdout")
    p.add_argument("--changed", nargs="*", metavar="FILE",
                   help="check every overlay these changed files affect (the pre-commit hook; "
                   "docs/pipeline.md#pre-commit-hook)")
    schema_flag(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("build-config", help="the Ray Serve LLM application (serveConfigV2) of an overlay")
    p.add_argument("overlay")
    p.add_argument("--json", action="store_true", help="JSON instead of YAML")
    p.set_defaults(func=cmd_build_config)

    p = sub.add_parser("tiny-model", help="build (or find cached) the local tiny HF model; prints its path")
    p.add_argument("--name", default="pdops-tiny", help="tiny-model://NAME in a release spec")
    p.set_defaults(func=cmd_tiny_model)

    p = sub.add_parser("doctor", help="say what of the installation is missing and why")
    p.add_argument("--quiet", action="store_true", help="print only problems")
    p.add_argument("--install", action="store_true",
                   help="only what set-up installs (not the local stack's memory and ports)")
    p.add_argument("--steps", action="store_true",
                   help="only what the Argo steps need (the step image: no NIXL, no local stack)")
    p.set_defaults(func=cmd_doctor)

    # The commands owned by other modules, registered by plain imports (import-linter sees them).
    from validation import cli as validation_cli
    from workflows.argo import definitions as argo
    from workflows.cli import adopt as adopt_cli, release as release_cli, run as run_cli, validate as validate_cli
    from workflows.pipeline import advise_patch
    from workflows.pipeline.pricing import release_inputs

    release_cli.register(sub)
    validate_cli.register(sub)
    # validation/ reads no release.yaml itself: its gate and plan-load get the reader from here
    validation_cli.register(sub, read_release=release_inputs)
    for module in (argo, adopt_cli, advise_patch, run_cli):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Ray Serve LLM's config models import vLLM, whose import-time notices (Triton, platform) would
    # bury our output: Ray routes vLLM's unconfigured loggers to its INFO root handler as JSON.
    # Engines run in their own processes; this process only reads vLLM's config classes.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return 2
    except TargetError as exc:
        print(f"failed{' (transient: safe to retry)' if exc.transient else ''}: {exc.render()}", file=sys.stderr)
        return EXIT_TRANSIENT if exc.transient else 1
    except MissingDependency as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
