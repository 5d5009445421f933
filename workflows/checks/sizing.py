"""Sizing rules: a phase must hold the weights and one max_model_len sequence; KV room vs the spec's
load; and the guide's warning that a model fitting on one node gains only a hop from P/D.
The figures come from workflows/render/sizing.py; `pdops size OVERLAY` prints the same table."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workflows.checks.findings import Finding
from workflows.checks.instances import phase_instances, quantity
from workflows.render.manifest import Rendered
from workflows.render.rendered import RenderedRelease, serve_path
from workflows.render.serve_config import PHASES
from workflows.render.sizing import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GIB,
    PhaseSize,
    architecture_of,
    load_demand,
    phase_size,
)


def size_release(v: RenderedRelease) -> list[PhaseSize]:
    """Per-phase sizing of a rendered release; [] when the model's architecture is unknown."""
    arch = architecture_of(v.rayservice or {})
    if arch is None:
        return []
    out, pinned, cpu = [], phase_instances(v), v.is_cpu
    for name in PHASES:
        phase = v.phases[name]
        engine = phase.engine
        mml = engine.get("max_model_len")
        args: dict[str, Any] = dict(tp=phase.tp, pp=phase.pp, nodes_per_replica=phase.nodes_per_replica,
                                    replicas=phase.max_serve_replicas, kv_dtype=engine.get("kv_cache_dtype"),
                                    max_model_len=int(mml) if mml else None)
        if cpu:
            env = (phase.group.env if phase.group else {}) | ((phase.config.get("runtime_env") or {})
                                                              .get("env_vars") or {})
            space = float(env.get("VLLM_CPU_KVCACHE_SPACE") or 0) or None
            containers = (phase.group.containers if phase.group else None) or [{}]
            limit = (containers[0].get("resources") or {}).get("limits", {}).get("memory")
            size = phase_size(arch, name, "cpu", device_memory_gib=quantity(limit) / GIB if limit else 0.0,
                              utilization=None, kv_space_gib=space, **args)
        elif name in pinned and (it := pinned[name][2]) is not None:
            it_name = pinned[name][1]
            util = float(engine.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
            size = phase_size(arch, name, it_name, device_memory_gib=it.gpu_memory_gib, utilization=util, **args)
        else:
            continue   # instance type unknown: the instance-type rule says so
        spec = v.rendered.spec
        demand = load_demand(spec, name) if spec else None
        if demand:
            size.load_tokens, size.load = demand
        out.append(size)
    return out


def one_node(v: RenderedRelease, sizes: list[PhaseSize]) -> str | None:
    """The guide's warning, with numbers, when weights plus one max_model_len sequence fit one node."""
    pinned = phase_instances(v)
    for s in sizes:
        it = pinned[s.phase][2] if s.phase in pinned else None
        if it is None or not s.max_model_len:
            continue
        need = s.weights_gib + s.kv_bytes_per_token * s.max_model_len / GIB
        have = it.gpus * it.gpu_memory_gib * (s.memory_utilization or 1.0)
        if need <= have:
            spans = "".join(f"; {x.phase} spans {x.nodes_per_replica} {x.node} per replica here, so one engine on a "
                            f"{s.node} would also save its pipeline hops" for x in sizes if x.nodes_per_replica > 1)
            return (f"the model fits on one {s.node}{spans}: weights {s.weights_gib:.1f} GiB + KV for one "
                    f"{s.max_model_len}-token sequence {s.kv_bytes_per_token * s.max_model_len / GIB:.1f} GiB = "
                    f"{need:.1f} GiB of {have:.0f} GiB usable ({it.gpus} x {it.gpu_memory_gib:g} GiB x "
                    f"{s.memory_utilization}). Disaggregation then adds a KV hop per request; the guide keeps P/D for "
                    "models that span nodes or for separately scaled phases. Compare against one engine "
                    "(scripts/bench_release.py) before adopting it")
    return None


def _where(v: RenderedRelease, name: str, rest: str) -> tuple[str, str]:
    return v.serve_file, serve_path(name, rest)


def sizing(v: RenderedRelease) -> Iterator[Finding]:
    sizes = size_release(v)
    for s in sizes:
        budget = s.device_memory_gib * (s.memory_utilization or 1.0)
        if not s.holds_weights:
            at = f"TP {s.tp}" + (f" x PP {s.pp}" if s.pp > 1 else "")
            yield Finding("size-weights", f"{s.phase} cannot hold the weights: {s.weights_per_device_gib:.1f} GiB per "
                          f"{'GPU' if s.memory_utilization else 'pod'} at {at} > {budget:.1f} GiB "
                          f"({s.device_memory_gib:g} GiB x {s.memory_utilization or 1.0})",
                          *_where(v, s.phase, "engine_kwargs.tensor_parallel_size"),
                          "raise tensor_parallel_size (up to a pod's GPUs), span nodes with pipeline_parallel_size, "
                          "use a larger GPU, or a smaller dtype (quantized model)")
        elif s.max_model_len and s.kv_tokens_per_replica < s.max_model_len:
            yield Finding("size-kv", f"{s.phase} has KV room for at most {s.kv_tokens_per_replica} tokens per replica "
                          f"({s.kv_room_gib:.2f} GiB / {s.kv_bytes_per_token_per_device / 1024:.0f} KiB per token) but "
                          f"max_model_len is {s.max_model_len}: vLLM refuses to start "
                          "(vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory)",
                          *_where(v, s.phase, "engine_kwargs.max_model_len"),
                          "lower model.max_model_len, raise tensor_parallel_size or gpu_memory_utilization")
        elif s.load_tokens and s.kv_tokens_per_replica * s.replicas < s.load_tokens:
            yield Finding("size-load", f"{s.phase} KV room {s.kv_tokens_per_replica * s.replicas} tokens "
                          f"({s.replicas} replicas x {s.kv_tokens_per_replica}) is below the {s.load_tokens} tokens "
                          f"the load {s.load} keeps in flight: requests will queue or be preempted",
                          *_where(v, s.phase, "deployment_config"),
                          "add replicas, raise TP, or lower the validation load's concurrency", severity="warning")
    note = one_node(v, sizes)
    if note:
        yield Finding("size-one-node", note, v.serve_file, "model", "", severity="info")
    if not sizes and not v.is_cpu and (v.rayservice or {}):
        yield Finding("size-unknown", "the model's architecture is unknown, so weights and KV room are not checked",
                      v.serve_file, "model.architecture",
                      "add model.architecture (parameters, layers, kv_heads, head_dim, dtype) from its config.json",
                      severity="info")


def size_table(r: Rendered) -> dict[str, Any]:
    """What `pdops size` prints: per-phase sizing, the one-node note and the sizing findings."""
    v = RenderedRelease.of(r)
    sizes = size_release(v)
    return {"source": r.file, "architecture": (a.model_dump() if (a := architecture_of(r.rayservice or {})) else None),
            "phases": [s.to_dict() for s in sizes], "one_node": one_node(v, sizes),
            "findings": [f.to_dict() for f in sizing(v)]}


RULES = [sizing]
