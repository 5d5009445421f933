"""Deadlines: the Argo workflow must outlast the waits of the release it runs.

Each `pdops` step waits on the cluster for at most its share of release.yaml `timeouts`
(spec.Timeouts.step_waits); the workflow cuts it off earlier in three ways (Argo Workflows v4.0.10):

- the step's `activeDeadlineSeconds` becomes the pod's, and the kubelet kills the pod at it; a pod's
  deadline is also cut to what is left of the *workflow's* `activeDeadlineSeconds`
  (workflow/controller/workflowpod.go createWorkflowPod: `wfActiveDeadlineSeconds <
  tmplActiveDeadlineSeconds` -> the smaller; exit-handler pods ignore the workflow deadline, "so they
  still run if the deadline has passed");
- `retryStrategy.backoff.maxDuration` counts from the first try's start; once past it no retry is
  made ("Max duration limit exceeded"), a backoff that would end past it is not waited ("Backoff
  would exceed max duration limit"), and the running try inherits it as its execution deadline
  (operator.go processNodeRetries: `opts.executionDeadline = maxDurationDeadline`; workflowpod.go
  getDeadline -> ARGO_DEADLINE, enforced by the executor);
- so the workflow's deadline must contain the longest chain of step deadlines in its DAG.

A step whose deadline cannot contain its waits is killed by Argo before the CLI times out and says
why (failing pods, Events), and a rollback or restore cut short leaves the environment half done.
The rule reads the committed workflow YAML (kustomize/argo/, beside the overlays) and the overlay's
own `timeouts`; it refuses what cannot contain them, naming the field and the fix.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from workflows.checks.findings import Finding
from workflows.render.manifest import Rendered, repository_root
from workflows.render.rendered import RenderedRelease
from workflows.spec.release import STEP_MARGIN_S, VALIDATION_LOADS_S, Timeouts

WORKFLOW_FILES = ("pd-release.yaml", "pd-canary.yaml")
WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")
FIX = ("regenerate the workflows from the spec timeouts (`pdops workflows render --out kustomize/argo`; their "
       "deadlines derive from every overlay's release.yaml `timeouts`), or lower the timeout in release.yaml")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: Any) -> float | None:
    """An Argo duration (`90`, `"90"`, `"90s"`, `"2m"`, `"1h30m"`) in seconds; None if unreadable."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value or "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def workflow_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    return (spec.get("workflowSpec") or {}) if obj.get("kind") == "CronWorkflow" else spec


def step_kind(template: dict[str, Any]) -> str | None:
    """Which `pdops` command a container template runs (render, rollout, validate, promote, rollback, run)."""
    container = template.get("container") or {}
    args = [str(a) for a in container.get("args") or []]
    if container.get("command") == ["pdops"] and args:
        return args[0]
    return None


def _retry_need(template: dict[str, Any], deadline: float) -> float:
    """What maxDuration must be so every try the limit allows can run to its deadline, with the backoffs."""
    retry = template.get("retryStrategy") or {}
    limit = int(str(retry.get("limit") or 0))
    backoff = retry.get("backoff") or {}
    first, factor = seconds(backoff.get("duration")) or 0.0, float(str(backoff.get("factor") or 1))
    cap = seconds(backoff.get("cap"))
    waits = sum(min(first * factor ** i, cap) if cap else first * factor ** i for i in range(limit))
    return (limit + 1) * deadline + waits


def _chain(spec: dict[str, Any], name: str, deadlines: dict[str, float], seen: frozenset[str] = frozenset()) -> float:
    """The longest sum of step deadlines along any path of template `name` (DAG or steps)."""
    templates = {t.get("name"): t for t in spec.get("templates") or []}
    template = templates.get(name) or {}
    if name in seen:
        return 0.0
    if "dag" in template:
        tasks = {t["name"]: t for t in template["dag"].get("tasks") or []}
        memo: dict[str, float] = {}

        def cost(task: str) -> float:
            if task not in memo:
                t = tasks[task]
                deps = t.get("dependencies") or re.findall(r"([A-Za-z0-9][A-Za-z0-9-]*)(?:\.\w+)?",
                                                         str(t.get("depends") or ""))
                memo[task] = _chain(spec, t.get("template", ""), deadlines, seen | {name}) + max(
                    [cost(d) for d in deps if d in tasks] or [0.0])
            return memo[task]
        return max([cost(t) for t in tasks] or [0.0])
    if "steps" in template:
        return sum(max([_chain(spec, s.get("template", ""), deadlines, seen | {name}) for s in group] or [0.0])
                   for group in template["steps"] or [])
    return deadlines.get(name, 0.0)


def problems(obj: dict[str, Any], timeouts: Timeouts) -> list[tuple[str, str]]:
    """(field, problem) for every deadline of one workflow object that cannot contain the waits."""
    spec, waits, out = workflow_spec(obj), timeouts.step_waits(), []
    deadlines: dict[str, float] = {}
    for t in spec.get("templates") or []:
        kind, where = step_kind(t), f"spec.templates[{t.get('name')}]"
        deadline = seconds(t.get("activeDeadlineSeconds"))
        if deadline is not None:
            deadlines[t["name"]] = deadline
        if kind not in waits:
            continue
        need = waits[kind] + (STEP_MARGIN_S if waits[kind] else 0)
        if deadline is None:
            out.append((f"{where}.activeDeadlineSeconds", f"`pdops {kind}` has no deadline: a hung step holds the "
                        "environment until someone stops it"))
            continue
        if deadline < need:
            out.append((f"{where}.activeDeadlineSeconds", f"{deadline:.0f}s cannot contain `pdops {kind}`'s waits of "
                        f"{waits[kind]:.0f}s plus {STEP_MARGIN_S}s to report why it stopped ({need:.0f}s)"))
        backoff = (t.get("retryStrategy") or {}).get("backoff") or {}
        if "maxDuration" in backoff:
            have, retry_need = seconds(backoff["maxDuration"]), _retry_need(t, deadline)
            if have is None or have < retry_need:
                out.append((f"{where}.retryStrategy.backoff.maxDuration",
                            f"{backoff['maxDuration']} ends the tries of `pdops {kind}` before they can run to their "
                            f"deadline ({retry_need:.0f}s: every try of the limit to {deadline:.0f}s plus the "
                            "backoffs); Argo kills the running try at maxDuration"))
    total = seconds(spec.get("activeDeadlineSeconds"))
    chain = _chain(spec, str(spec.get("entrypoint") or ""), deadlines)
    if total is not None and total < chain:
        out.append(("spec.activeDeadlineSeconds", f"{total:.0f}s is shorter than the longest chain of step deadlines "
                    f"({chain:.0f}s): Argo cuts the last steps' pods to what is left of it"))
    return out


def committed_workflows(overlay: Path) -> tuple[Path, list[dict[str, Any]]] | None:
    """The pipeline's committed workflow objects (kustomize/argo/ of the overlay's repository)."""
    folder = repository_root(overlay) / "kustomize" / "argo"
    if not all((folder / f).is_file() for f in WORKFLOW_FILES):
        return None
    objs = [o for f in WORKFLOW_FILES for o in yaml.safe_load_all((folder / f).read_text(encoding="utf-8"))
            if isinstance(o, dict) and o.get("kind") in WORKFLOW_KINDS]
    return folder, objs


def deadlines(v: RenderedRelease) -> Iterator[Finding]:
    r = v.rendered
    if r.spec is None or r.overlay is None:
        yield Finding("deadlines", "workflow deadlines not checked: a rendered manifest carries no release.yaml "
                      "timeouts", r.file, "timeouts", "run `pdops check OVERLAY` to check them", "info")
        return
    found = committed_workflows(r.overlay)
    if found is None:
        yield Finding("deadlines", f"workflow deadlines not checked: no {' and '.join(WORKFLOW_FILES)} in "
                      "kustomize/argo/ beside the overlays", r.spec_file(), "timeouts",
                      "render them: `pdops workflows render --out kustomize/argo`", "info")
        return
    folder, objs = found
    for obj in objs:
        name = f"{obj['kind']}/{(obj.get('metadata') or {}).get('name', '?')}"
        file = next((str(folder / f) for f in WORKFLOW_FILES if f.startswith(name.split("/")[1])), str(folder))
        for field, problem in problems(obj, r.spec.timeouts):
            yield Finding("deadlines", f"{problem} (timeouts from {r.spec_file()})", file, f"{name} {field}", FIX)
    yield from _planned_loads(r)


def _planned_loads(r: Rendered) -> Iterator[Finding]:
    """Loads planned by duration must fit the validate step's share for loads (spec.VALIDATION_LOADS_S)."""
    assert r.spec is not None
    v, slo = r.spec.validation, r.spec.slo
    sides = 2 if slo.vs_stable is not None and slo.vs_stable.measure == "live" else 1
    planned = sum(load.duration_s or 0 for load in v.load) * slo.statistics.max_looks * sides
    if planned > VALIDATION_LOADS_S:
        yield Finding("deadlines", f"the timed loads take {planned:.0f}s (duration_s x {slo.statistics.max_looks} "
                      f"look(s) x {sides} side(s)), more than the validate step's {VALIDATION_LOADS_S}s for loads",
                      r.spec_file(), "validation.load[].duration_s",
                      "shorten duration_s or max_looks, or raise spec.VALIDATION_LOADS_S and regenerate the workflows")


RULES = [deadlines]
