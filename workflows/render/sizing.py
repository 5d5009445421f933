"""Sizing: does the model fit each phase, how much KV each replica holds, is P/D justified.

Per phase, from the model's shape and the rendered release (so `check -f` sizes too):
  weights per GPU          = parameters x dtype bytes / TP x (layers of the largest stage / layers)
  KV bytes per token       = 2 (K and V) x layers x KV heads x head_dim x KV dtype bytes
  per GPU, vLLM shards KV heads over TP: max(1, KV heads // TP) heads each
                             (vllm/config/model.py ModelConfig.get_num_kv_heads)
                             and layers over PP stages: ceil(layers / PP) on the largest stage
                             (vllm/distributed/utils.py get_pp_indices gives the remainder to the
                             stages before the last)
  KV tokens per replica    = (GPU memory x gpu_memory_utilization - weights per GPU) / KV bytes per token per GPU
  max sequences            = KV tokens per replica // max_model_len
With PP the embeddings sit on the first stage and the LM head on the last (about 1% of a 405B
model's weights, 0.5 GiB per GPU at TP 8): the per-stage share of the layers ignores them.
This is an upper bound: vLLM also sets aside its profiled peak activation memory and CUDA graphs
before the KV cache (vllm/v1/worker/gpu_worker.py determine_available_memory). On CPU the KV room
is VLLM_CPU_KVCACHE_SPACE GiB per engine and the weights live in the pod's memory.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workflows.spec import tiny_model
from workflows.spec.release import DTYPE_BYTES, Architecture, ReleaseSpec

ARCH_ANNOTATION = "pdops.dev/model-architecture"
# vLLM's default (vllm/config/cache.py CacheConfig.gpu_memory_utilization, the vLLM in .venv).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
GIB = 2**30   # bytes in a GiB: the one definition (checks and `pdops size` import it)
_ST_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def _dtype(config: dict[str, Any]) -> str:
    name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    return name if name in DTYPE_BYTES else "bfloat16"


def _llama_parameters(c: dict[str, Any]) -> float:
    """Parameter count of a Llama-shaped config (embeddings, attention, gated MLP, norms, lm_head)."""
    h, heads, kv, layers = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // heads
    per_layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * c["intermediate_size"] + 2 * h
    embed = c["vocab_size"] * h
    return embed * (1 if c.get("tie_word_embeddings") else 2) + layers * per_layer + h


def _safetensors_parameters(folder: Path) -> float | None:
    """Exact parameter count from the safetensors headers (8-byte length, then a JSON header)."""
    total, files = 0, sorted(folder.glob("*.safetensors"))
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, t in header.items():
            if key != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count
    return float(total) if files else None


def from_config(config: dict[str, Any], parameters: float | None, source: str) -> Architecture:
    heads = config["num_attention_heads"]
    return Architecture(parameters=parameters or _llama_parameters(config), layers=config["num_hidden_layers"],
                        kv_heads=config.get("num_key_value_heads") or heads,
                        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                        dtype=_dtype(config), source=source)


def resolve(spec: ReleaseSpec) -> Architecture | None:
    """The spec's model.architecture, else config.json of a local model directory, else None."""
    if spec.model.architecture:
        return spec.model.architecture
    source = spec.model.source
    if source.startswith(tiny_model.SCHEME):   # from its recipe: the same whether or not it is built yet
        r = tiny_model.RECIPE
        config = {"hidden_size": r["hidden_size"], "num_attention_heads": r["num_attention_heads"],
                  "num_key_value_heads": r["num_key_value_heads"], "head_dim": r["head_dim"],
                  "num_hidden_layers": r["num_hidden_layers"], "intermediate_size": r["intermediate_size"],
                  "vocab_size": r["vocab_size"], "torch_dtype": "float32"}
        return from_config(config, None, f"{source} (workflows/spec/tiny_model.py RECIPE)")
    folder = Path(source)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return from_config(config, _safetensors_parameters(folder), str(folder / "config.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return None   # a hub id or s3:// path: set model.architecture in release.yaml


def annotation(spec: ReleaseSpec) -> str | None:
    arch = resolve(spec)
    return json.dumps(arch.model_dump(exclude_none=True), sort_keys=True) if arch else None


def architecture_of(rayservice: dict[str, Any]) -> Architecture | None:
    raw = ((rayservice or {}).get("metadata", {}).get("annotations") or {}).get(ARCH_ANNOTATION)
    try:
        return Architecture.model_validate_json(raw) if raw else None
    except ValueError:
        return None


@dataclass
class PhaseSize:
    phase: str
    node: str                      # instance type, or "cpu"
    tp: int
    replicas: int
    device_memory_gib: float       # per GPU (CPU: the pod's memory)
    memory_utilization: float | None
    weights_per_device_gib: float
    kv_bytes_per_token: float      # whole model
    kv_bytes_per_token_per_device: float
    kv_room_gib: float             # per device, after weights (CPU: VLLM_CPU_KVCACHE_SPACE)
    kv_tokens_per_replica: int
    max_model_len: int | None
    max_sequences: int | None
    load_tokens: int | None = None  # KV the spec's heaviest load needs in this phase at once
    load: str = ""
    pp: int = 1                    # pipeline stages per replica
    nodes_per_replica: int = 1     # worker pods (nodes) one replica spans
    weights_gib: float = 0.0       # whole model

    @property
    def holds_weights(self) -> bool:
        budget = self.device_memory_gib * (self.memory_utilization or 1.0)
        return self.weights_per_device_gib < budget

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"holds_weights": self.holds_weights}


def stage_layers(arch: Architecture, pp: int) -> int:
    """Layers on the largest pipeline stage (vllm/distributed/utils.py get_pp_indices)."""
    return -(-arch.layers // pp)


def kv_bytes_per_token(arch: Architecture, kv_dtype: str | None, tp: int = 1, pp: int = 1) -> float:
    """KV bytes one token takes: the whole model at tp=pp=1, else on one GPU of the largest stage."""
    dtype = arch.dtype if not kv_dtype or kv_dtype == "auto" else ("fp8" if kv_dtype.startswith("fp8") else kv_dtype)
    heads = max(1, arch.kv_heads // tp)
    return 2 * stage_layers(arch, pp) * heads * arch.head_dim * DTYPE_BYTES.get(dtype, 2.0)


def phase_size(arch: Architecture, phase: str, node: str, tp: int, replicas: int, device_memory_gib: float,
               utilization: float | None, kv_dtype: str | None, max_model_len: int | None,
               kv_space_gib: float | None = None, pp: int = 1, nodes_per_replica: int = 1) -> PhaseSize:
    weights = arch.weight_bytes / tp / GIB * stage_layers(arch, pp) / arch.layers
    per_device = kv_bytes_per_token(arch, kv_dtype, tp, pp)
    room = kv_space_gib if kv_space_gib is not None else max(0.0, device_memory_gib * (utilization or 1.0) - weights)
    tokens = int(room * GIB // per_device)
    return PhaseSize(phase, node, tp, replicas, device_memory_gib, utilization, weights,
                     kv_bytes_per_token(arch, kv_dtype), per_device, room, tokens, max_model_len,
                     tokens // max_model_len if max_model_len else None,
                     pp=pp, nodes_per_replica=nodes_per_replica, weights_gib=arch.weight_bytes / GIB)


def load_demand(spec: ReleaseSpec, phase: str) -> tuple[int, str] | None:
    """Tokens of KV the heaviest closed-loop load of the spec holds at once in `phase`: concurrency x
    (prompt tokens, plus output tokens on decode). Rate loads have no fixed concurrency: skipped."""
    from validation import profiles

    best = None
    for load in spec.validation.load:
        if load.rate or not load.concurrency:
            continue
        try:
            p = profiles.get(load.profile)
        except KeyError:
            continue
        tokens = load.concurrency * (p.prompt_tokens + (p.output_tokens if phase == "decode" else 0))
        if best is None or tokens > best[0]:
            best = (tokens, f"{load.profile} c={load.concurrency}")
    return best
