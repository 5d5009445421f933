"""KV compatibility: prefill and decode must agree on what vLLM hashes before it moves KV.

vLLM's NIXL connector refuses a handshake between engines whose compatibility hash differs
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py `compute_nixl_compatibility_hash`,
checked in nixl/base_worker.py `_nixl_handshake`: "NIXL compatibility hash mismatch"). The hash
covers the model, its dtype, the KV cache dtype, the attention backend, the hybrid KV cache manager
and the speculative config. A release whose phases differ there deploys, then Ray Serve LLM's decode
pre-warm (pd_server.py `_maybe_prewarm`) fails its handshake three times and the candidate ends
DEPLOY_FAILED minutes later (measured on the local stack: 141 s, when a test overlay set only
decode's engine_kwargs and dropped its `dtype: float32`). Caught here, before anything is applied.
TP size, block size and KV layout are left out: vLLM validates them at runtime for heterogeneous P/D.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workflows.checks.findings import Finding
from workflows.render.rendered import RenderedRelease, serve_path

# engine_kwargs key -> the value an unset key means (vllm/engine/arg_utils.py EngineArgs defaults)
HASHED: dict[str, Any] = {"dtype": "auto", "kv_cache_dtype": "auto", "attention_backend": None,
                          "disable_hybrid_kv_cache_manager": None, "speculative_config": None,
                          "quantization": None}


def kv_compat(v: RenderedRelease) -> Iterator[Finding]:
    pre, dec = v.phases["prefill"].engine, v.phases["decode"].engine
    for key, default in HASHED.items():
        p, d = pre.get(key, default), dec.get(key, default)
        if p != d:
            yield Finding("kv-compat", f"prefill {key} is {p!r} but decode's is {d!r}: vLLM's NIXL handshake "
                          "refuses engines whose compatibility hash differs, so the candidate never becomes ready",
                          v.serve_file, serve_path("decode", f"engine_kwargs.{key}"),
                          f"set the same {key} in prefill.engine_kwargs and decode.engine_kwargs of release.yaml")


RULES = [kv_compat]
