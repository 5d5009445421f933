"""The release history in the ConfigMap `pdops-history-<release>`, bounded in bytes.

A ConfigMap's values may total 1 MiB (kubernetes pkg/apis/core/validation ValidateConfigMap:
totalSize > core.MaxSecretSize = 1 MiB -> 422). One rendered manifest is ~10 KiB, and a failed
release's reasons can carry Serve tracebacks of tens of KiB; unbounded, a history passes the limit,
and from then on every write of it fails (rollback included, after it deleted the candidate).
So the store keeps what rollback needs and trims the rest, always under BUDGET:
- manifests (and the release.yaml spec recorded with them, what the canary judges by) only where
  they can be redeployed: the stable and candidate slots and the promoted records (a rolled-back or
  failed release is never redeployed; its digest and revision stay);
- each reason cut to REASON_CHARS (the full text is in the run's report);
- then the cached golden answers (ReleaseRecord.golden, golden_cache.py) of the oldest records, and
  of the slots if they alone take half the budget: a miss only starts the reference again;
- the canary's run history (canary.json: running sums per check and the last runs, ~30-60 KiB) is
  counted first; when it would take more than a tenth of the budget only its last 8 runs are kept;
- then the oldest records, never the last good one, until it fits. A manifest that alone exceeds
  the budget is refused before anything is applied.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workflows.names import HISTORY_LABEL, PART_OF
from workflows.targets.base import HISTORY_KEEP, ReleaseRecord, TargetError, last_good
from workflows.targets.kube.api import Conflict, Kube

LIMIT = 1024 * 1024               # core.MaxSecretSize
BUDGET = LIMIT - 64 * 1024        # room for keys, labels and the next record's growth
REASON_CHARS = 2000


@dataclass
class State:
    """What the history ConfigMap holds."""

    release: str | None = None
    history: list[ReleaseRecord] = field(default_factory=list)
    stable: ReleaseRecord | None = None
    candidate: ReleaseRecord | None = None
    canary: dict[str, Any] | None = None   # the canary's run history of the serving release (validation/canary.py)


def _cut(text: str) -> str:
    if len(text) <= REASON_CHARS:
        return text
    return text[:REASON_CHARS] + f" ... [{len(text) - REASON_CHARS} more characters in the report]"


def _slim(record: ReleaseRecord, keep_manifest: bool) -> ReleaseRecord:
    """Reasons cut; manifest and bench baseline kept only where the record can be redeployed or compared with."""
    return record.model_copy(update={"reasons": [_cut(r) for r in record.reasons],
                                     "manifest": record.manifest if keep_manifest else "",
                                     "baseline": record.baseline if keep_manifest else None,
                                     "spec": record.spec if keep_manifest else None,
                                     "golden": record.golden if keep_manifest else None})


def encode(state: State, budget: int = BUDGET) -> dict[str, str]:
    """history.json and slots.json for `state`, trimmed to `budget` bytes (UTF-8) together."""
    def dump(r: ReleaseRecord | None) -> Any:
        return r.model_dump(mode="json") if r else None
    canary = _canary(state.canary, budget // 10)
    budget -= len(canary.encode())
    kept = {"stable": state.stable and _slim(state.stable, True),
            "candidate": state.candidate and _slim(state.candidate, True)}
    slots = json.dumps({k: dump(r) for k, r in kept.items()})
    for slot in ("candidate", "stable"):   # the slots' golden answers go before the history refuses them
        if len(slots.encode()) > budget // 2 and (record := kept[slot]) is not None and record.golden:
            kept[slot] = record.model_copy(update={"golden": None})
            slots = json.dumps({k: dump(r) for k, r in kept.items()})
    if len(slots.encode()) > budget // 2:
        raise TargetError(f"the release's manifests take {len(slots.encode())} bytes; "
                          f"the history ConfigMap holds {LIMIT}",
                          ["a rendered manifest should be ~10 KiB: check the overlay for embedded files "
                           "or huge serve configs"])
    good = last_good(state.history)
    records = [_slim(r, r.verdict == "promote") for r in state.history[-HISTORY_KEEP:]]
    while True:
        history = json.dumps([dump(r) for r in records])
        if len(history.encode()) + len(slots.encode()) <= budget or len(records) <= 1:
            return {"history.json": history, "slots.json": slots, **({"canary.json": canary} if canary else {})}
        cached = next((i for i, r in enumerate(records) if r.golden), None)
        if cached is not None:   # golden answers of the oldest record first: a miss only restarts the reference
            records[cached] = records[cached].model_copy(update={"golden": None})
            continue
        drop = next((i for i, r in enumerate(records)
                     if good is None or r.digest != good.digest or r.verdict != "promote"), 0)
        records.pop(drop)


def _canary(canary: dict[str, Any] | None, budget: int) -> str:
    if not canary:
        return ""
    text = json.dumps(canary)
    if len(text.encode()) > budget:   # the running sums decide; the recent runs are the report's
        text = json.dumps({**canary, "recent": canary.get("recent", [])[-8:]})
    return text


def decode(data: dict[str, str], release: str) -> State:
    slots = json.loads(data.get("slots.json") or "{}")
    def one(key: str) -> ReleaseRecord | None:
        return ReleaseRecord.model_validate(slots[key]) if slots.get(key) else None
    history = [ReleaseRecord.model_validate(r) for r in json.loads(data.get("history.json") or "[]")]
    return State(release=release, history=history,
                 stable=one("stable"), candidate=one("candidate"),
                 canary=json.loads(data["canary.json"]) if data.get("canary.json") else None)


class HistoryStore:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    @staticmethod
    def name(release: str) -> str:
        return f"pdops-history-{release}"

    def find_release(self) -> str | None:
        """The one release of this namespace, by the history ConfigMap's label."""
        found = self.kube.list("ConfigMap", HISTORY_LABEL)
        if len(found) > 1:
            names = sorted(c["metadata"]["name"] for c in found)
            raise TargetError(f"several pdops releases in namespace {self.kube.namespace}: {', '.join(names)}",
                              ["keep one release per namespace (one RayService per environment)"])
        return found[0]["metadata"]["labels"][HISTORY_LABEL] if found else None

    def read(self, release: str) -> State:
        cm = self.kube.get("ConfigMap", self.name(release))
        return decode((cm or {}).get("data") or {}, release)

    def update(self, release: str, change: Callable[[State], bool]) -> bool:
        """Read, `change` in place, write back with the resourceVersion read: the API server refuses a
        write whose resourceVersion is stale with 409 Conflict (k8s.io/apiserver pkg/registry/generic/
        registry/store.go Update: OptimisticLockErrorMsg "the object has been modified; please apply
        your changes to the latest version and try again"), so nothing another writer saved in between
        is lost: read again and retry. False: no history, or `change` found nothing to change."""
        for _ in range(3):
            cm = self.kube.get("ConfigMap", self.name(release))
            if cm is None:
                return False
            state = decode(cm.get("data") or {}, release)
            if not change(state):
                return False
            body = self._object(state)
            body["metadata"]["resourceVersion"] = cm["metadata"]["resourceVersion"]
            try:
                self.kube.replace(body)
                return True
            except Conflict:
                continue
        raise TargetError(f"ConfigMap {self.name(release)} changed under every one of 3 writes",
                          ["another writer is busy in this namespace: check `pdops status` and run again"],
                          transient=True)

    def save(self, state: State) -> None:
        self.kube.apply(self._object(state))

    def _object(self, state: State) -> dict[str, Any]:
        """The ConfigMap holding `state` (save applies it; update replaces it with a resourceVersion)."""
        assert state.release
        return {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name(state.release), "namespace": self.kube.namespace,
                         "labels": {**PART_OF, "app.kubernetes.io/managed-by": "pdops", HISTORY_LABEL: state.release}},
            "data": encode(state)}
