"""The change phase balance asks for: from benchmark runs' verdicts (validation/balance.py) to new
replicas (or autoscaling bounds) for each side that queued, and the worker-group pods they need.

    replicas wanted  = max(current + 1, ceil(current x suggested / engines the run had))
                       (fixed replicas); with autoscaling, max_replicas rises to the suggestion, or,
                       when the old max already allowed it, min_replicas does (the autoscaler had
                       room and still queued: the floor must hold the load)
    pods of a group  = ceil(replicas / replicas per pod), replicas per pod = floor(min(GPUs, the
                       phase's Ray resource) per pod / tensor_parallel_size) (each engine worker's
                       placement bundle takes one GPU and one unit of the phase resource)

workflows/pipeline/advise_patch.py turns the change into a unified diff and checks it; this module only plans.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from validation.balance import Balance
from workflows.errors import InputError
from workflows.render.manifest import Rendered
from workflows.render.rendered import RenderedRelease
from workflows.render.serve_config import PHASE_RESOURCE


class PhaseChange(BaseModel):
    phase: str
    runs: list[str]                        # the bench files that found this phase bound
    engines: int
    suggested: int
    replicas: tuple[int, int] | None = None            # fixed replicas: before, after
    autoscaling: tuple[tuple[int, int], tuple[int, int]] | None = None   # (min, max) before, after
    group: str
    pods: tuple[int, int]                  # worker-group pods before, after
    per_pod: int                           # engine replicas one pod holds

    def lines(self) -> list[str]:
        out = [f"{self.phase} queued in {', '.join(self.runs)} with {self.engines} engine(s); "
               f"the load wants {self.suggested} (validation/balance.py rule)"]
        if self.replicas:
            out.append(f"release.yaml {self.phase}.replicas: {self.replicas[0]} -> {self.replicas[1]}")
        if self.autoscaling:
            (lo0, hi0), (lo1, hi1) = self.autoscaling
            out.append(f"release.yaml {self.phase}.autoscaling min/max_replicas: {lo0}/{hi0} -> {lo1}/{hi1}")
        if self.pods[1] != self.pods[0]:
            out.append(f"worker group {self.group!r}: {self.pods[0]} -> {self.pods[1]} pods "
                       f"({self.per_pod} replica(s) per pod)")
        else:
            out.append(f"worker group {self.group!r}: its {self.pods[0]} pods already hold them")
        return out


def read_balances(paths: list[str]) -> list[tuple[str, Balance]]:
    """Each run's verdict; a file that is no benchmark run, or one without per-phase figures, is an
    InputError naming it. A report.json (its `benches`) counts as its runs."""
    out = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(path, "", f"cannot read the bench JSON: {exc}",
                             "pass a bench-*.json of a release run (or of pdops bench --json)") from None
        runs: list[Any] = (data["benches"] if isinstance(data, dict) and isinstance(data.get("benches"), list)
                           else [data])
        for i, bench in enumerate(runs):
            label = path if len(runs) == 1 else f"{path} benches[{i}]"
            if not isinstance(bench, dict) or "wall_s" not in bench:
                raise InputError(label, "wall_s", "not a benchmark result",
                                 "pass a bench-*.json written by a release run or pdops bench --json")
            if not bench.get("balance"):
                raise InputError(label, "balance", "the run has no phase-balance figures (its metrics were not "
                                 "split by phase)", "run it through `pdops release`/`pdops validate`, or pdops bench "
                                 "--metrics-url URL#prefill,URL#decode")
            try:
                out.append((label, Balance.model_validate(bench["balance"])))
            except ValidationError as exc:
                err = exc.errors()[0]
                raise InputError(label, "balance." + ".".join(map(str, err["loc"])), err["msg"],
                                 "pass the file as the benchmark wrote it") from None
    return out


def _per_pod(rendered: Rendered, phase: str, tp: int) -> tuple[str, int, int]:
    """(group name, pods now, engine replicas per pod) of the phase's worker group."""
    groups = RenderedRelease.of(rendered).groups
    if phase not in groups:
        raise InputError(rendered.kustomization_file(), "workerGroupSpecs", f"no worker group named {phase!r}",
                         "keep the base's prefill and decode groups")
    group = groups[phase]
    units = float((group.ray_resources or {}).get(PHASE_RESOURCE[phase]) or 0)
    gpus = group.gpus
    room = min(units, gpus) if gpus > 0 else units
    pods = int(group.raw.get("maxReplicas") or group.raw.get("replicas") or 1)
    return phase, pods, int(room // tp)


def plan(rendered: Rendered, balances: list[tuple[str, Balance]]) -> list[PhaseChange]:
    """The change for every phase some run found bound (the largest suggestion wins)."""
    spec = rendered.spec
    assert spec is not None
    bound: dict[str, list[tuple[str, Any]]] = {}
    for label, bal in balances:
        if bal.suggestion is not None:
            bound.setdefault(bal.suggestion.phase, []).append((label, bal.suggestion))
    changes = []
    for phase, found in sorted(bound.items()):
        s = max((sug for _, sug in found), key=lambda x: x.replicas / max(x.engines, 1))
        cfg = getattr(spec, phase)
        group, pods, per_pod = _per_pod(rendered, phase, cfg.tensor_parallel_size)
        change = PhaseChange(phase=phase, runs=[lab for lab, _ in found], engines=s.engines, suggested=s.replicas,
                             group=group, pods=(pods, pods), per_pod=per_pod)
        if cfg.autoscaling:
            a = cfg.autoscaling
            lo, hi = ((a.min_replicas, s.replicas) if s.replicas > a.max_replicas
                      else (max(a.min_replicas, s.replicas), a.max_replicas))
            if (lo, hi) == (a.min_replicas, a.max_replicas):   # already there: one more engine at the top
                hi += 1
            change.autoscaling, top = ((a.min_replicas, a.max_replicas), (lo, hi)), hi
        else:
            now = int(cfg.replicas or 1)
            top = max(now + 1, math.ceil(now * s.replicas / max(s.engines, 1)))
            change.replicas = (now, top)
        if per_pod < 1:
            raise InputError(rendered.kustomization_file(), f"workerGroupSpecs[{group}]",
                             f"one {group} pod cannot hold a replica of tensor_parallel_size "
                             f"{cfg.tensor_parallel_size}",
                             "fix the group's GPUs or Ray resources first (pdops check says how)")
        change.pods = (pods, max(pods, math.ceil(top / per_pod)))
        changes.append(change)
    return changes
