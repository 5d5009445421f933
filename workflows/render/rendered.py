"""One typed view of a rendered release, built once and handed to every check.

    view = RenderedRelease.of(rendered)
    view.phases["prefill"].tp, .pp, .devices, .nodes_per_replica, .engine, .kv, .group.gpus
    view.groups["decode"].limit(EFA), .env, .ray_resources, .path

The rendered objects stay dicts (what kustomize and Ray produce, and what `check -f` reads back);
this view reads the RayService and its serve config once and derives the figures the checks share
in one place each: TP x PP (`Phase.devices`), the worker pods one replica spans
(`Phase.nodes_per_replica`), a group's resource limits, and the field paths findings name.
Values of the wrong type raise TypeError/ValueError where they are read, which `lint` reports as
"could not be checked" naming the rule.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from workflows.render.manifest import MAX_POSITIONS_ANNOTATION, Rendered
from workflows.render.serve_config import PHASES, app_args

GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class WorkerGroup:
    """One entry of the RayService's workerGroupSpecs."""

    name: str
    index: int
    raw: dict[str, Any]
    path: str                      # "RayService/NAME spec.rayClusterConfig.workerGroupSpecs[i]"

    @property
    def pod(self) -> dict[str, Any]:
        return (self.raw.get("template") or {}).get("spec") or {}

    @property
    def containers(self) -> list[dict[str, Any]]:
        return list(self.pod.get("containers") or [])

    def limit(self, resource: str) -> float:
        """The sum of the containers' limits of `resource` (0 when none sets it)."""
        total = 0.0
        for c in self.containers:
            value = ((c.get("resources") or {}).get("limits") or {}).get(resource)
            total += float(value) if value is not None else 0.0
        return total

    @property
    def gpus(self) -> float:
        return self.limit(GPU)

    @property
    def env(self) -> dict[str, Any]:
        """Literal env values of the containers (valueFrom ones are in env_names only)."""
        out: dict[str, Any] = {}
        for c in self.containers:
            out.update({e.get("name"): e.get("value") for e in c.get("env") or []})
        return out

    @property
    def env_names(self) -> set[str]:
        return {str(e.get("name")) for c in self.containers for e in c.get("env") or []}

    @property
    def ray_resources(self) -> dict[str, Any] | None:
        """rayStartParams.resources as a mapping; None when absent or unreadable."""
        raw = (self.raw.get("rayStartParams") or {}).get("resources")
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            value = json.loads(value) if isinstance(value, str) else value  # KubeRay quotes it twice
            return value if isinstance(value, dict) else None
        except (TypeError, ValueError):
            return None

    @property
    def max_pods(self) -> int:
        return int(self.raw.get("maxReplicas") or 0)


@dataclass(frozen=True)
class Phase:
    """One phase (prefill or decode): its serve-config section and its worker group."""

    name: str
    config: dict[str, Any]         # serveConfigV2 applications[0].args.<name>_config
    group: WorkerGroup | None      # the worker group named like the phase; None when missing

    @property
    def engine(self) -> dict[str, Any]:
        return self.config.get("engine_kwargs") or {}

    @property
    def kv(self) -> dict[str, Any] | None:
        return self.engine.get("kv_transfer_config")

    @property
    def connector(self) -> str:
        return str(self.kv.get("kv_connector") or "") if isinstance(self.kv, dict) else ""

    @property
    def tp(self) -> int:
        return int(self.engine.get("tensor_parallel_size") or 1)

    @property
    def pp(self) -> int:
        return int(self.engine.get("pipeline_parallel_size") or 1)

    @property
    def devices(self) -> int:
        """GPUs one replica takes: TP x PP (vLLM ParallelConfig world_size, vllm/config/parallel.py)."""
        return self.tp * self.pp

    @property
    def nodes_per_replica(self) -> int:
        """Worker pods one replica spans: TP x PP GPUs over the group's GPUs per pod (1 on CPU, when
        the pod requests no GPUs, which gpu-fit reports, or when the group is missing)."""
        gpus = int(self.group.gpus) if self.group is not None else 0
        return 1 if gpus <= 0 or self.devices <= gpus else -(-self.devices // gpus)

    @property
    def max_serve_replicas(self) -> int:
        dc = self.config.get("deployment_config") or {}
        auto = dc.get("autoscaling_config") or {}
        return int(auto.get("max_replicas") or dc.get("num_replicas") or 1)

    @property
    def is_cpu(self) -> bool:
        return (self.config.get("accelerator_config") or {}).get("kind") == "cpu"

    def serve_path(self, rest: str) -> str:
        """The field a finding names in the serve config (release.yaml sets it)."""
        return serve_path(self.name, rest)


def serve_path(phase: str, rest: str) -> str:
    return f"serveConfigV2.applications[0].args.{phase}_config.{rest}"


@dataclass(frozen=True)
class RenderedRelease:
    """The typed view of a Rendered (see the module docstring); build it with `of`."""

    rendered: Rendered
    rayservice: dict[str, Any] | None
    args: dict[str, Any]           # the P/D application's args ({} when the serve config has none)

    @classmethod
    def of(cls, rendered: Rendered) -> RenderedRelease:
        rs = rendered.rayservice
        return cls(rendered, rs, app_args(rendered.serve_config) if rs is not None else {})

    @cached_property
    def name(self) -> str:
        """`RayService/NAME`, as findings name it."""
        return f"RayService/{(self.rayservice or {}).get('metadata', {}).get('name', '?')}"

    @cached_property
    def cluster(self) -> dict[str, Any]:
        return ((self.rayservice or {}).get("spec") or {}).get("rayClusterConfig") or {}

    @cached_property
    def annotations(self) -> dict[str, Any]:
        return (self.rayservice or {}).get("metadata", {}).get("annotations") or {}

    @cached_property
    def max_positions(self) -> str | None:
        """The model's context limit the render carried (MAX_POSITIONS_ANNOTATION), if known."""
        return self.annotations.get(MAX_POSITIONS_ANNOTATION)

    @cached_property
    def groups(self) -> dict[str, WorkerGroup]:
        """Worker groups by groupName."""
        prefix = f"{self.name} spec.rayClusterConfig.workerGroupSpecs"
        return {g.get("groupName"): WorkerGroup(g.get("groupName"), i, g, f"{prefix}[{i}]")
                for i, g in enumerate(self.cluster.get("workerGroupSpecs") or [])}

    @cached_property
    def phases(self) -> dict[str, Phase]:
        """Prefill and decode (PHASES), each with its serve-config section and worker group."""
        return {n: Phase(n, _dict(self.args.get(f"{n}_config")), self.groups.get(n)) for n in PHASES}

    @cached_property
    def is_cpu(self) -> bool:
        """A CPU (local) release: some phase runs on the CPU accelerator."""
        return any(p.is_cpu for p in self.phases.values())

    @property
    def serve_file(self) -> str:
        """The file a person edits for serve-config fields (release.yaml, or the manifest given)."""
        return self.rendered.spec_file()

    @property
    def kustomization_file(self) -> str:
        return self.rendered.kustomization_file()

    def group_path(self, index: int) -> str:
        return f"{self.name} spec.rayClusterConfig.workerGroupSpecs[{index}]"

    def containers(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(field path, container) of the head and every worker group."""
        head = ((self.cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        for i, c in enumerate(head.get("containers") or []):
            yield f"{self.name} spec.rayClusterConfig.headGroupSpec.template.spec.containers[{i}]", c
        for group in self.groups.values():
            for i, c in enumerate(group.containers):
                yield f"{group.path}.template.spec.containers[{i}]", c
