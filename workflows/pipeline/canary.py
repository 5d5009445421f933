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
from typing import TYPE_CHECKING, Any

from workflows.names import RUN_ENV
from workflows.targets.base import Progress, Target, TargetError

if TYPE_CHECKING:
    from validation.canary import CanaryVerdict
    from validation.reports import Decision


def run_id(run: Path) -> str:
    return os.environ.get(RUN_ENV) or Path(run).name


def judge_canary(target: Target, decision: Decision, run: Path, progress: Progress) -> CanaryVerdict:
    """Record this run in the target's canary history and decide on it. A target that keeps no
    history cannot run the sequential test: fails closed with the fix.

    The entry is built inside the target's read-modify-write (`update_canary_history`): the function
    gets the history as stored at the write's read, so when the write meets a 409 (another writer
    stored in between) and reads again, this run is added to what the other writer stored instead of
    overwriting it with a history built from the earlier read (issue 22). The verdict is decided on
    the history of the attempt that was stored, so the step acts on what the next run will read."""
    from validation import canary

    update = getattr(target, "update_canary_history", None)
    if update is None:
        raise TargetError(f"the {target.kind} target keeps no canary history: the canary cannot judge latency "
                          "across runs", ["run the canary on the local or kubernetes target"])
    record = target.status().stable.release
    if record is None:
        raise TargetError("no stable release: nothing for the canary to judge", ["promote a release first"])
    rid, at, stats = run_id(run), time.time(), canary.latency_stats(decision)
    added: list[bool] = []    # one per attempt of the write; the last is the stored one

    def add(current: dict[str, Any] | None) -> dict[str, Any]:
        # idempotent per run id: a run already recorded (a retried step) comes back unchanged
        history, fresh = canary.record(current, record.digest, rid, at, stats)
        added.append(fresh)
        return history

    history = update(add)
    if added and not added[-1]:
        progress(f"[canary] run {rid} is already in the history (a retried step): not recorded again")
    verdict = canary.decide(decision, history)
    for line in verdict.lines:
        progress(f"[canary] {line}")
    return verdict
