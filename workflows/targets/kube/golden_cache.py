"""Reference answers for golden tokens, cached in the ConfigMap `pdops-golden-<release>`.

Starting the reference RayService costs a decode pod's model load (minutes, 4 GPUs on dev) for a
few prompts; the answers depend only on the engine (llm_config and images, reference.py
engine_identity), the prompts and max_tokens, so a re-release of the same model reads them here.
One data key per answer set (`<sha256[:32]>.json`); bounded to KEEP sets and BUDGET bytes (a
ConfigMap holds 1 MiB: kubernetes ValidateConfigMap, core.MaxSecretSize), oldest dropped first; a
set alone over ENTRY_LIMIT is not cached (64 prompts x 4096 tokens would be ~1.5 MB of ids).
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from workflows.names import GOLDEN_LABEL, PART_OF
from workflows.targets.kube.api import Kube

KEEP = 8
BUDGET = 512 * 1024
ENTRY_LIMIT = 128 * 1024


def name(release: str) -> str:
    return f"pdops-golden-{release}"


def key(identity: dict[str, Any], prompts: list[str], max_tokens: int) -> str:
    blob = json.dumps([identity, prompts, max_tokens], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def read(kube: Kube, release: str, k: str) -> list[dict] | None:
    cm = kube.get("ConfigMap", name(release))
    text = ((cm or {}).get("data") or {}).get(f"{k}.json")
    try:
        return json.loads(text)["answers"] if text else None
    except (ValueError, KeyError, TypeError):   # hand-edited or truncated: a miss, the reference runs
        return None


def save(kube: Kube, release: str, k: str, answers: list[dict]) -> str:
    """Store one answer set; returns what was done, for the progress line."""
    text = json.dumps({"saved_at": time.time(), "answers": answers}, separators=(",", ":"))
    if len(text) > ENTRY_LIMIT:
        return f"not cached: {len(text)} bytes of answers, over {ENTRY_LIMIT}"
    cm = kube.get("ConfigMap", name(release))
    data = dict((cm or {}).get("data") or {})
    data[f"{k}.json"] = text

    def saved_at(item: tuple[str, str]) -> float:
        try:
            return float(json.loads(item[1])["saved_at"])
        except (ValueError, KeyError, TypeError):
            return 0.0
    entries = sorted(data.items(), key=saved_at)
    while len(entries) > KEEP or sum(len(a) + len(b) for a, b in entries) > BUDGET:
        entries.pop(0)
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name(release), "namespace": kube.namespace,
                             "labels": {**PART_OF, GOLDEN_LABEL: release}},
                "data": dict(entries)})
    return f"cached in ConfigMap {name(release)} ({len(entries)} answer sets)"
