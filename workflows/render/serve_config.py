"""ReleaseSpec -> the Ray Serve LLM prefill/decode application that lands in spec.serveConfigV2.

This module is the only place that knows the serve-config shape; it is checked by Ray's own
Pydantic models (PDServingArgs / LLMConfig from the installed `ray`), never by a copy of them.
"""
from __future__ import annotations

import copy
from typing import Any

from workflows.errors import InputError
from workflows.render import cache, diff_fields
from workflows.spec.release import Phase, ReleaseSpec

IMPORT_PATH = "ray.serve.llm:build_pd_openai_app"
PHASES = ("prefill", "decode")
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Custom Ray resource each worker group advertises (rayStartParams.resources) and each engine
# worker's placement bundle asks for: this is what pins a phase to its own node group.
PHASE_RESOURCE = {"prefill": "prefill_node", "decode": "decode_node"}


def placement_strategy(phase: Phase) -> str:
    """The Ray placement-group strategy of one replica's TP x PP worker bundles.

    Ray Serve LLM replicates `bundle_per_worker` TP x PP times (ray/llm/_internal/serve/engines/vllm/
    vllm_models.py VLLMEngineConfig.placement_bundles, `for _ in range(self.num_devices)`, with
    num_devices = tensor_parallel_degree * pipeline_parallel_degree) and hands the list and `strategy`
    to the deployment's placement group (core/server/llm_server.py get_deployment_options,
    "placement_group_strategy": engine_config.placement_strategy); PlacementGroupConfig accepts PACK,
    SPREAD, STRICT_PACK, STRICT_SPREAD (ray/llm/_internal/common/placement.py).
    Without pipeline stages a replica stays on one node: STRICT_PACK, so TP never crosses nodes.
    With stages, STRICT_PACK could never be placed once TP x PP exceeds a node's GPUs, and SPREAD would
    scatter a TP group over nodes: PACK fills a node before the next, and vLLM's Ray executor then
    orders ranks node by node (driver's node first) so each TP group of TP consecutive ranks sits on
    one node and only the pipeline hops cross nodes (vllm/v1/executor/ray_executor.py
    _init_workers_ray, sort_by_driver_then_worker_ip; `pdops check` rule pp-gpus keeps whole nodes
    per replica so no stage is split). PACK also keeps a PP replica that fits one node on one node.
    """
    return "STRICT_PACK" if phase.pipeline_parallel_size == 1 else "PACK"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _deployment_config(phase: Phase) -> dict[str, Any]:
    config: dict[str, Any] = {"max_ongoing_requests": phase.max_ongoing_requests}
    if phase.autoscaling:
        config["autoscaling_config"] = {
            "min_replicas": phase.autoscaling.min_replicas,
            "max_replicas": phase.autoscaling.max_replicas,
            "target_ongoing_requests": phase.autoscaling.target_ongoing_requests,
        }
    else:
        config["num_replicas"] = phase.replicas
    return config


def llm_config(spec: ReleaseSpec, name: str) -> dict[str, Any]:
    """One phase's LLMConfig as plain data (what serveConfigV2 holds)."""
    phase: Phase = getattr(spec, name)
    device = "CPU" if spec.accelerator.kind == "cpu" else "GPU"
    kv = spec.kv_transfer
    engine: dict[str, Any] = {
        "tensor_parallel_size": phase.tensor_parallel_size,
        "kv_transfer_config": {
            "kv_connector": kv.connector,
            "kv_role": KV_ROLE[name],
            "kv_buffer_device": kv.buffer_device,
            "kv_connector_extra_config": {"backends": list(kv.backends)},
        },
    }
    if phase.pipeline_parallel_size > 1:   # vLLM's default is 1: leave it out so PP-less renders stay as they were
        engine["pipeline_parallel_size"] = phase.pipeline_parallel_size
    if spec.model.max_model_len:
        engine["max_model_len"] = spec.model.max_model_len
    if spec.accelerator.kind == "cpu":
        engine["enforce_eager"] = True  # torch.compile warm-up costs about a minute on small CPUs
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": spec.model.id, "model_source": spec.model.source},
        "engine_kwargs": _merge(engine, phase.engine_kwargs),
        "accelerator_config": {"kind": spec.accelerator.kind},
        "placement_group_config": {
            "bundle_per_worker": {device: 1, PHASE_RESOURCE[name]: 1},
            "strategy": placement_strategy(phase),
        },
        "deployment_config": _deployment_config(phase),
        "log_engine_metrics": True,
    }
    if spec.accelerator.kind == "gpu" and spec.accelerator.type:
        config["accelerator_type"] = spec.accelerator.type
    if phase.env:
        config["runtime_env"] = {"env_vars": dict(sorted(phase.env.items()))}
    if name == "decode" and spec.prewarm:
        config["experimental_configs"] = {"_prewarm_prefill_decode": True}
    return config


def build_serve_config(spec: ReleaseSpec) -> dict[str, Any]:
    """The serveConfigV2 document: one P/D application served at the root route."""
    return {
        "applications": [{
            "name": spec.name,
            "route_prefix": "/",
            "import_path": IMPORT_PATH,
            "args": {name + "_config": llm_config(spec, name) for name in PHASES},
        }]
    }


def app_args(serve_config: dict[str, Any]) -> dict[str, Any]:
    """The PDServingArgs of the (single) P/D application in a serve config; {} when it has none
    (or a hand-edited manifest gives these keys values of another shape)."""
    apps = serve_config.get("applications")
    pd = [a for a in (apps if isinstance(apps, list) else [])
          if isinstance(a, dict) and a.get("import_path") == IMPORT_PATH]
    args = pd[0].get("args") if pd else None
    return args if isinstance(args, dict) else {}


# What Ray's verdict on a serve config depends on besides the config: the installed Ray Serve LLM
# models, the vLLM config classes they import, and the Pydantic that runs them.
_VERDICT_DEPENDS_ON = ("ray", "vllm", "pydantic", "pydantic-core")


class RayVerdict(cache.Entry):
    """Ray's PDServingArgs verdict on one serve config, as cached (see workflows/render/cache.py)."""

    valid: bool
    loc: list[str | int] = []   # Ray's error location and message when not valid
    msg: str = ""


def _ray_verdict(args: dict[str, Any], model: str = "PDServingArgs") -> RayVerdict:
    """Ray's own verdict on the P/D args (or, `model="LLMServingArgs"`, on build_openai_app's): from the
    cache when these versions judged these args before. Any other exception Ray raises propagates and
    is not cached (it may be transient)."""
    tag = "ray-pd-serving-args" if model == "PDServingArgs" else f"ray-{model}"
    key = cache.digest(tag, {d: cache.version(d) for d in _VERDICT_DEPENDS_ON}, args)
    if key is not None and (hit := cache.read("ray-verdicts", key, RayVerdict)) is not None:
        return hit
    from pydantic import ValidationError
    try:   # Ray Serve LLM's config models import vLLM (and torch) at import time: ~9-16 s on 2 cores
        if model == "PDServingArgs":
            from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs as Args
        else:   # what ray.serve.llm:build_openai_app validates its args with (core/ingress/builder.py)
            from ray.llm._internal.serve.core.ingress.builder import LLMServingArgs as Args
    except ImportError as exc:
        from workflows.errors import MissingDependency

        missing = getattr(exc, "name", None) or ("vllm" if "vLLM" in str(exc) else "ray[serve]")
        raise MissingDependency(missing, "validating the serve config with Ray Serve LLM's own models", exc) from None

    diff_fields.remember()   # vLLM is imported now: the diff's field list costs nothing here (diff_fields.py)
    try:
        Args.model_validate(copy.deepcopy(args))
        verdict = RayVerdict(key=key or "", valid=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        verdict = RayVerdict(key=key or "", valid=False, loc=list(err["loc"]), msg=err["msg"])
    if key is not None:
        cache.write("ray-verdicts", verdict)
    return verdict


def validate_with_ray(serve_config: dict[str, Any], file: str) -> None:
    """Run Ray's own PDServingArgs validation; raise InputError naming the field on failure."""
    args = app_args(serve_config)
    paths = [key for key, value in args.items() if isinstance(value, str)]
    if paths:   # PDServingArgs would open it as a YAML file on this machine
        raise InputError(file, f"serveConfigV2.applications[0].args.{paths[0]}",
                         "a string here is a file path Ray reads locally; the config must be inline",
                         "render the overlay with `pdops render`")
    try:
        verdict = _ray_verdict(args)
    except (ValueError, TypeError, AttributeError, KeyError, OSError) as exc:   # Ray's validators assume shapes
        raise InputError(file, "serveConfigV2.applications[0].args",
                         f"rejected by Ray Serve LLM's PDServingArgs: {exc}") from None
    if not verdict.valid:
        field = "serveConfigV2.applications[0].args." + ".".join(str(p) for p in verdict.loc)
        raise InputError(file, field, f"rejected by Ray Serve LLM's PDServingArgs: {verdict.msg}",
                         "fix the release spec field that produces it (docs/release-spec.md)")


# ---- the single-engine reference (golden tokens, `pdops diff`) --------------------------------------

REFERENCE_IMPORT_PATH = "ray.serve.llm:build_openai_app"
# Decode settings that exist only for P/D: the NIXL connector, the prefill->decode prewarm, the
# local target's NIXL side-channel ports. One aggregated engine has no KV to receive.
_PD_ONLY_EXPERIMENTAL = ("_prewarm_prefill_decode", "NIXL_SIDE_CHANNEL_PORT_BASE")


def reference_serve_config(serve_config: dict[str, Any], name: str) -> dict[str, Any]:
    """One aggregated Ray Serve LLM application (`build_openai_app`) serving the P/D application's
    decode engine as a single engine: its llm_config minus `kv_transfer_config` and the P/D-only
    experimental settings, one replica. Checked by Ray's own LLMServingArgs; InputError when the
    P/D application has no decode_config or Ray refuses the result."""
    args = app_args(serve_config)
    decode = copy.deepcopy(args.get("decode_config"))
    if not isinstance(decode, dict) or not isinstance(decode.get("engine_kwargs", {}), dict):
        raise InputError("serveConfigV2", "applications[0].args.decode_config",
                         "the P/D application has no decode_config to derive the single-engine reference from",
                         "render the overlay with `pdops render` (build_pd_openai_app with prefill and decode configs)")
    decode.get("engine_kwargs", {}).pop("kv_transfer_config", None)
    experimental = {k: v for k, v in (decode.pop("experimental_configs", None) or {}).items()
                    if k not in _PD_ONLY_EXPERIMENTAL}
    if experimental:
        decode["experimental_configs"] = experimental
    deployment = {k: v for k, v in (decode.get("deployment_config") or {}).items()
                  if k not in ("num_replicas", "autoscaling_config")}
    decode["deployment_config"] = {**deployment, "num_replicas": 1}   # one engine: the reference
    llm_args: dict[str, Any] = {"llm_configs": [decode]}
    if isinstance(args.get("ingress_deployment_config"), dict):
        llm_args["ingress_deployment_config"] = copy.deepcopy(args["ingress_deployment_config"])
    try:
        verdict = _ray_verdict(llm_args, "LLMServingArgs")
    except (ValueError, TypeError, AttributeError, KeyError, OSError) as exc:   # Ray's validators assume shapes
        verdict = RayVerdict(key="", valid=False, msg=str(exc))
    if not verdict.valid:
        raise InputError("serveConfigV2", "reference.args." + ".".join(str(p) for p in verdict.loc),
                         f"the single-engine reference derived from decode_config is rejected by Ray Serve LLM's "
                         f"LLMServingArgs: {verdict.msg}", "fix the decode phase of the release spec")
    return {"applications": [{"name": name, "route_prefix": "/", "import_path": REFERENCE_IMPORT_PATH,
                              "args": llm_args}]}
