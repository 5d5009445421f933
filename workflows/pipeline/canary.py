"""The scheduled canary's decision across runs (validation/canary.py) over a target's run history.

`pdops validate --slot stable` (pd-canary's validate-stable step) records each run's latency figures
in the target's canary history of the serving release (local: ~/.pdops/local/canary.json beside the
release state; kubernetes: the release history ConfigMap) and decides: hard failures at once,
latency when a CUSUM crosses its threshold. The run id is PDOPS_RUN_ID, which every pd-canary step
gets as `{{workflow.name}}` (workflows/argo/definitions.py _env): a CronWorkflow names each scheduled
run's Workflow `<cron>-<scheduled unix time>` (argo-workflows workflow/cron/operator.go
getChildWorkflowName), and a step's retries are child nodes of that same Workflow
(workflow/controller/operator.go processNodeRetries), so a retried step records nothing twice.
Without PDOPS_RUN_ID (a local `pdops validate --slot stable`) the run folder's name is the id.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.names import RUN_ENV
from workflows.targets.base import Progress, Target, TargetError

if TYPE_CHECKING:
    from validation.canary import CanaryVerdict
    from validation.reports import Decision


def run_id(run: Path) -> str:
    return os.environ.get(RUN_ENV) or Path(run).name


def judge_canary(target: Target, decision: Decision, run: Path, progress: Progress) -> CanaryVerdict:
    """Record this run in the target's canary history and decide on it. A target that keeps no
    history cannot run the sequential test: fails closed with the fix."""
    from validation import canary

    load, save = getattr(target, "canary_history", None), getattr(target, "save_canary_history", None)
    if load is None or save is None:
        raise TargetError(f"the {target.kind} target keeps no canary history: the canary cannot judge latency "
                          "across runs", ["run the canary on the local or kubernetes target"])
    record = target.status().stable.release
    if record is None:
        raise TargetError("no stable release: nothing for the canary to judge", ["promote a release first"])
    history, added = canary.record(load(), record.digest, run_id(run), time.time(), canary.latency_stats(decision))
    if added:
        save(history)
    else:
        progress(f"[canary] run {run_id(run)} is already in the history (a retried step): not recorded again")
    verdict = canary.decide(decision, history)
    for line in verdict.lines:
        progress(f"[canary] {line}")
    return verdict
