"""Reference answers for golden tokens, cached in the release record they belong to.

Starting the reference RayService costs a decode pod's model load (minutes, 4 GPUs on dev) for a
few prompts; the answers depend only on the engine (llm_config and images, reference.py
engine_identity), the prompts and max_tokens. They are kept in `ReleaseRecord.golden` of every
record of that release (same digest) in the history ConfigMap (history.py), so they rotate and are
deleted with the release's record, a restore of an older release brings that release's answers, and
a canary of an unchanged release starts no reference engine. Per record at most KEEP answer sets;
a set over ENTRY_LIMIT is not cached (64 prompts x 4096 tokens would be ~1.5 MB of ids, and a
ConfigMap holds 1 MiB in all: kubernetes pkg/apis/core/validation ValidateConfigMap,
core.MaxSecretSize). The history's byte budget drops golden answers of old records before it drops
a record (history.encode).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from workflows.targets.base import ReleaseRecord
from workflows.targets.kube.history import HistoryStore, State

KEEP = 2
ENTRY_LIMIT = 128 * 1024


def key(identity: dict[str, Any], prompts: list[str], max_tokens: int) -> str:
    blob = json.dumps([identity, prompts, max_tokens], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _records(state: State, digest: str) -> list[ReleaseRecord]:
    return [r for r in (state.stable, state.candidate, *state.history) if r is not None and r.digest == digest]


def find(state: State, digest: str, k: str) -> list[dict] | None:
    """The answers cached with the release `digest`, if any of its records holds them."""
    for record in _records(state, digest):
        answers = (record.golden or {}).get(k)
        if isinstance(answers, list):
            return answers
    return None


def save(store: HistoryStore, record: ReleaseRecord, k: str, answers: list[dict]) -> str:
    """Store one answer set in every record of `record`'s release; returns what was done, for the progress line."""
    size = len(json.dumps(answers, separators=(",", ":")))
    if size > ENTRY_LIMIT:
        return f"not cached: {size} bytes of answers, over {ENTRY_LIMIT}"

    def change(state: State) -> bool:
        found = _records(state, record.digest)
        for r in found:
            kept = [(key_, a) for key_, a in (r.golden or {}).items() if key_ != k][-(KEEP - 1):] if KEEP > 1 else []
            r.golden = {**dict(kept), k: answers}
        return bool(found)
    if not store.update(record.name, change):
        return f"not cached: {record.short()} is not in the release history"
    return f"cached in the release record of {record.short()} (ConfigMap {store.name(record.name)})"
