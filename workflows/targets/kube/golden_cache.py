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

Before, the answers lived in a ConfigMap of their own, `pdops-golden-<release>` (labelled
pdops.dev/golden-of, up to 512 KiB). Nothing reads it now; retire_legacy moves the answer set a
reference run asks for into the release record and deletes it, once (see there).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from workflows.targets.base import ReleaseRecord
from workflows.targets.kube.api import ApiError, Kube
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
    if find(store.read(record.name), record.digest, k) is None:   # history.encode dropped them to fit
        return f"not cached: the history ConfigMap {store.name(record.name)} has no room for them under 1 MiB"
    return f"cached in the release record of {record.short()} (ConfigMap {store.name(record.name)})"


def legacy_name(release: str) -> str:
    """The ConfigMap an earlier pdops (before ReleaseRecord.golden) cached golden answers in
    (data `<key>.json`: {"saved_at", "answers"})."""
    return f"pdops-golden-{release}"


def retire_legacy(kube: Kube, store: HistoryStore, record: ReleaseRecord, k: str) -> str | None:
    """Remove the previous design's ConfigMap `pdops-golden-<release>`, keeping the answer set `k` it
    holds (same key: engine, prompts, max_tokens) in `record`'s release record, so the upgrade
    starts no reference engine. Once and idempotent: a GET that finds none sends no write (a cluster
    that never had one sees none), and the delete carries the uid read as precondition (409 if the
    name now holds another object: a failed precondition is an InvalidObj error, which apiserver
    pkg/storage/errors InterpretDeleteError answers with NewConflict; 404: gone already, Kube.delete
    returns False). It is harmless if it stays (nothing reads it;
    the release is found by the history's label, not this one), so a refusal -- a 403 from a
    pd-release Role applied before it granted `delete` on configmaps, a 500 -- is reported, not
    raised: the next reference run tries again. Returns the progress line, None when there was none."""
    name = legacy_name(record.name)
    try:
        cm = kube.get("ConfigMap", name)
        if cm is None:
            return None
        kept = ""
        text = (cm.get("data") or {}).get(f"{k}.json")
        try:
            answers = json.loads(text)["answers"] if text else None
        except (ValueError, KeyError, TypeError):   # hand-edited or truncated: not carried over
            answers = None
        if isinstance(answers, list) and find(store.read(record.name), record.digest, k) is None:
            kept = f"; its answers for {k[:12]} {save(store, record, k, answers)}"
        kube.delete("ConfigMap", name, uid=cm["metadata"].get("uid"))
        return f"removed ConfigMap {name}, the previous golden-answer cache{kept}"
    except ApiError as exc:
        return (f"ConfigMap {name} (the previous golden-answer cache, no longer read) left in place: {exc}; "
                f"harmless, or remove it: kubectl -n {kube.namespace} delete configmap {name}")
