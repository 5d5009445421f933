"""What the target commands share (`pdops release ...` in release.py, `pdops validate` in validate.py): the
target flags and the target they open, the progress printer, the result printer and the API key the endpoints want.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.errors import InputError
from workflows.names import RUN_ENV

if TYPE_CHECKING:
    from workflows.spec.release import Timeouts
    from workflows.targets.base import Target


def progress(started: float) -> Callable[[str], None]:
    """A printer of progress lines to stderr, each stamped with the minutes:seconds since `started`."""
    def say(msg: str) -> None:
        m, s = divmod(int(time.monotonic() - started), 60)
        print(f"[{m:02d}:{s:02d}] {msg}", file=sys.stderr, flush=True)
    return say


def emit(args: argparse.Namespace, data: dict, text: str) -> None:
    """The result on stdout: JSON with --json, else the readable text."""
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        print()
    else:
        print(text)


def api_key() -> str | None:
    """The API key sent to the served endpoint (PDOPS_API_KEY), None when unset or empty."""
    return os.environ.get("PDOPS_API_KEY") or None


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def timeouts_of(args: argparse.Namespace) -> Timeouts:
    """The overlay's release.yaml `timeouts` (its defaults for commands without an overlay). An
    unreadable spec gives the defaults with a warning: a rollback must not depend on the overlay."""
    from workflows.spec.release import Timeouts, load_spec

    overlay = getattr(args, "overlay", None)
    if overlay and (Path(overlay) / "release.yaml").is_file():
        try:
            return load_spec(Path(overlay)).timeouts
        except InputError as exc:
            print(f"warning: default timeouts, the overlay's spec is unreadable: {exc.render()}", file=sys.stderr)
    return Timeouts()


def open_target(args: argparse.Namespace, step: str | None = None) -> Target:
    """The target of `args`; on Kubernetes with the overlay's `timeouts`, and for an Argo `step`
    every wait of this process bounded by that step's share of them (Timeouts.step_waits)."""
    if args.target == "kubernetes":
        from workflows.targets.kubernetes import KubernetesTarget

        if not args.namespace:
            raise InputError("--namespace", "", "the kubernetes target needs a namespace", "pass --namespace llm-<env>")
        t = timeouts_of(args)
        return KubernetesTarget(args.namespace, kubeconfig=args.kubeconfig, context=args.context,
                                dry_run=args.dry_run, restore_timeout_s=t.restore_s, drain_grace_s=t.drain_s,
                                reference_timeout_s=t.reference_s,
                                budget_s=t.step_waits()[step] if step else None,
                                run_id=os.environ.get(RUN_ENV) or None)
    from workflows.targets.local import LocalTarget

    return LocalTarget()


def target_flags(p: argparse.ArgumentParser, overlay: bool = False) -> None:
    """The flags every command acting on a target shares."""
    p.add_argument("--target", choices=("local", "kubernetes"), default="local",
                   help="local: Ray on 127.0.0.1 (default); kubernetes: the cluster of your kubeconfig")
    if overlay:
        p.add_argument("--overlay", default="overlays/local", help="overlay directory (default overlays/local)")
    p.add_argument("--namespace", help="kubernetes: namespace of the RayServices (llm-<env>)")
    p.add_argument("--kubeconfig", help="kubernetes: kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--context", help="kubernetes: kubeconfig context")
    p.add_argument("--dry-run", type=_bool, default=False, metavar="BOOL",
                   help="kubernetes: server-side dry run, nothing persisted (default false)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def outputs_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outputs", metavar="DIR",
                   help="(Argo steps) also write verdict, summary and figures, one file each, into DIR")
