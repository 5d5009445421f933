"""The request fields the differential suite's coverage is judged against, kept in the render cache.

`pdops diff` reports which request fields of the installed OpenAI SDK and vLLM protocol models no case
covers (validation/diff/matrix.py schema_fields). Importing vLLM's protocol models costs about 10 s of
a core in a process that has not imported vLLM (measured 2026-12-07: 9.9 s alone), and nothing in one
that has: `pdops check` / `render` imports them with Ray Serve LLM's config models on a cache miss of
Ray's verdict (serve_config.py), so it keeps the fields here, keyed by the two installed versions. The
validate step of an Argo run receives check's cache as an artifact (workflows/argo/definitions.py) and
its diff reads them instead of importing vLLM; a miss (no artifact, other versions, a corrupt entry)
imports as before. The fields are a function of the installed packages only.
"""
from __future__ import annotations

from workflows.render import cache

DEPENDS_ON = ("vllm", "openai")


class DiffFields(cache.Entry):
    fields: dict[str, dict[str, list[str]]]   # {"chat": {"openai": [...], "vllm": [...]}, "completions": ...}


def _key() -> str | None:
    return cache.digest("diff-fields", {d: cache.version(d) for d in DEPENDS_ON})


def cached() -> dict[str, dict[str, set[str]]] | None:
    """The kept fields for the installed versions, or None (then the diff imports vLLM's models)."""
    key = _key()
    hit = cache.read("diff-fields", key, DiffFields) if key is not None else None
    if hit is None:
        return None
    return {api: {src: set(names) for src, names in per.items()} for api, per in hit.fields.items()}


def remember() -> None:
    """Keep the installed fields; call it where vLLM is already imported (else it costs the import).
    Only a full set (vLLM's models found) is kept: an image without vLLM keeps nothing."""
    from validation.diff.matrix import schema_fields

    try:
        key, fields = _key(), schema_fields()
    except Exception:  # noqa: BLE001 - a field list that cannot be read is not kept; the diff reads it itself
        return
    if key is not None and all("vllm" in per for per in fields.values()):
        cache.write("diff-fields", DiffFields(key=key, fields={api: {src: sorted(names) for src, names in per.items()}
                                                                for api, per in fields.items()}))
