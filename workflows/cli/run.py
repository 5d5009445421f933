"""`pdops run start | end --run-id ID`: one environment lock per Argo run.

The Lease `pdops-release` (coordination.k8s.io, targets/kube/lease.py) is what protects an
environment: Argo's mutex covers the runs of one controller only. The run's first step takes it
(`run start`, holder `run ID`), every later writing step runs with $PDOPS_RUN_ID=ID and renews it
while it runs, failing with who holds it when the run does not (KubernetesTarget.session), and the
workflow's exit handler releases it (`run end`). A second run waits while the holder renews nothing
(a dead run's Lease is taken over after RUN_LEASE_S unchanged) and fails naming the holder when it
sees it renewed, or after --wait.
Exit codes: 0 taken / released (or nothing to release), 1 held by another run, 75 API unreachable.
"""
from __future__ import annotations

import argparse
import time

from workflows.cli.common import progress as _progress
from workflows.errors import InputError
from workflows.names import LOCK_NAME, RUN_LEASE_S, run_lease_s


def _kube(args: argparse.Namespace):
    from workflows.targets.kube.api import Kube
    from workflows.targets.kubernetes import KubernetesTarget

    if not args.namespace:
        raise InputError("--namespace", "", "the run lock is per namespace", "pass --namespace llm-<env>")
    target = KubernetesTarget(args.namespace, kubeconfig=args.kubeconfig, context=args.context)
    kube: Kube = target.kube
    return kube


def cmd_start(args: argparse.Namespace) -> int:
    from workflows.targets.kube.lease import ReleaseLock, run_holder

    say = _progress(time.monotonic())
    lock = ReleaseLock(_kube(args), run_holder(args.run_id), run_lease_s(), poll_s=min(5.0, max(args.wait, 0.05)))
    lock.acquire(say, max_wait_s=args.wait, renew=False)
    print(f"{run_holder(args.run_id)} holds Lease {LOCK_NAME} in {args.namespace}")
    return 0


def _remove_started(args: argparse.Namespace) -> None:
    """What a run starts besides the slots: single-engine reference and baseline RayServices (the
    canary's exit handler: a killed or timed-out run must not leave them, nor their GPUs). Under
    the run's Lease, as every writer; a run that no longer holds it leaves them to the holder."""
    from workflows.targets.kubernetes import KubernetesTarget

    say = _progress(time.monotonic())
    target = KubernetesTarget(args.namespace, kubeconfig=args.kubeconfig, context=args.context, run_id=args.run_id)
    with target.session():
        gone = target.remove_references(say, "cleanup") + target.remove_baselines(say, "cleanup")
    print(f"removed {', '.join(gone)}" if gone else "nothing the run started is left")


def cmd_end(args: argparse.Namespace) -> int:
    from workflows.targets.kube.api import Conflict
    from workflows.targets.kube.lease import run_holder

    kube = _kube(args)
    if args.remove_started:
        _remove_started(args)
    lease = kube.get("Lease", LOCK_NAME)
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
    if lease is None or holder != run_holder(args.run_id):
        print(f"Lease {LOCK_NAME}: held by {holder or 'nobody'}, not {run_holder(args.run_id)}: nothing to release")
        return 0
    try:   # only if still ours: a taker's Lease has another resourceVersion
        kube.delete("Lease", LOCK_NAME, resource_version=lease["metadata"]["resourceVersion"])
    except Conflict:
        print(f"Lease {LOCK_NAME} changed while releasing it: left to its new holder")
        return 0
    print(f"released Lease {LOCK_NAME} of {run_holder(args.run_id)}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("run", help="(steps) the environment lock of one Argo run: start takes it, end releases it")
    actions = p.add_subparsers(dest="run_action", required=True, metavar="ACTION")
    for name, func, text in (("start", cmd_start, "take the environment's Lease for run ID (the first step)"),
                             ("end", cmd_end, "release it if run ID still holds it (the exit handler)")):
        a = actions.add_parser(name, help=text)
        a.add_argument("--run-id", required=True, help="the run's id, e.g. {{workflow.name}}")
        a.add_argument("--target", choices=("kubernetes",), default="kubernetes")
        a.add_argument("--namespace", help="namespace of the environment (llm-<env>)")
        a.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
        a.add_argument("--context", help="kubeconfig context")
        if name == "end":
            a.add_argument("--remove-started", action="store_true",
                           help="first delete the reference and baseline RayServices the run started")
        if name == "start":
            a.add_argument("--wait", type=float, default=run_lease_s() + 60,
                           help=f"seconds to wait for another run's Lease (default {RUN_LEASE_S + 60}: a dead "
                           "run's is taken over once unchanged for its duration)")
        a.set_defaults(func=func)
