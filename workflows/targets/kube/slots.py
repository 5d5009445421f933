"""Moving releases between the slots: rollout, promote, rollback (the Kubernetes target's write paths).

A mixin of KubernetesTarget (target.py), which supplies the API (`kube`), state (`_state`, `_save`),
readiness (`_wait`, `_wait_gone`) and the capacity check. Every path that applies a colour's
RayService first waits for an earlier one of that name to finish terminating (KubeRay's
finalizer), and promote drains the Service before it deletes the old colour.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from workflows.names import COLOUR_LABEL
from workflows.targets.base import Progress, ReleaseRecord, TargetError, appended, last_good, other_colour
from workflows.targets.kube import objects as obj, traffic

if TYPE_CHECKING:
    from workflows.targets.kube.history import State

DRAIN_TIMEOUT_S = 300.0  # endpoints follow a selector change in seconds; longer means the new colour is not serving


class Slots:
    kube: Any
    dry_run: bool
    namespace: str
    restore_timeout_s: float
    drain_grace_s: float
    poll_s: float
    _dry_candidate: ReleaseRecord | None

    if TYPE_CHECKING:  # supplied by KubernetesTarget (target.py); declared here for the type checker only
        def _state(self, release: str | None = None) -> State: ...
        def _save(self, state: State) -> None: ...
        def _check_lock(self) -> None: ...
        def _candidate(self, state: State) -> ReleaseRecord: ...
        def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress) -> None: ...
        def _wait_gone(self, name: str, progress: Progress, step: str = "rollout") -> None: ...
        def _check_capacity(self, candidate: ReleaseRecord, progress: Progress) -> None: ...
        def remove_references(self, progress: Progress, step: str = "reference") -> list[str]: ...

    def apply(self, record: ReleaseRecord, progress: Progress) -> ReleaseRecord:
        state = self._state(record.name)
        pending = state.candidate or self._dry_candidate
        if pending is not None:
            if pending.digest != record.digest:
                raise TargetError(
                    f"candidate {pending.short()} is pending in {pending.colour}; {record.short()} cannot start",
                    ["run `pdops rollback --if-candidate-pending` first "
                     "(it records the pending candidate as rolled back)"])
            rs = self.kube.get("RayService", obj.rs_name(pending))
            if rs is None or rs["metadata"].get("deletionTimestamp"):
                progress(f"[rollout] {pending.short()} is pending but its RayService is missing; applying it again")
                self._apply_release(pending, progress)
            else:
                progress(f"[rollout] {pending.short()} is already the pending candidate in {pending.colour}; "
                         "nothing applied")
            return pending
        if state.stable is not None and state.stable.digest == record.digest:
            progress(f"[rollout] {record.short()} is already stable in {state.stable.colour}; nothing applied")
            return state.stable
        colour = other_colour(state.stable.colour) if state.stable else "blue"
        candidate = record.model_copy(update={"colour": colour, "verdict": "pending", "applied_at": time.time(),
                                              "reasons": [], "decided_at": None})
        obj.check(candidate, self.namespace)
        if self.kube.get("RayService", obj.rs_name(candidate)) is not None:
            # Left by a run that died after promote, or still terminating after a rollback: applying
            # over it would upgrade (or lose) it in place, so it goes first.
            progress(f"[rollout] removing leftover RayService {obj.rs_name(candidate)} (not recorded in any slot)")
            self._remove_colour(candidate, progress, "rollout")
            self._wait_gone(obj.rs_name(candidate), progress)
        self._check_capacity(candidate, progress)
        state.release = state.release or record.name
        state.candidate = candidate
        self._save(state)  # intent first: a run that dies after this leaves a candidate rollback can remove
        self._apply_release(candidate, progress)
        if self.dry_run:
            self._dry_candidate = candidate
        return candidate

    def promote(self, reasons: list[str], report: str | None, progress: Progress, *,
                baseline: list[dict] | None = None) -> ReleaseRecord:
        state = self._state()
        candidate = self._candidate(state)
        if (not (self.dry_run and candidate is self._dry_candidate)
                and self.kube.get("RayService", obj.rs_name(candidate)) is None):
            raise TargetError(f"the candidate's RayService {obj.rs_name(candidate)} is gone; nothing to promote",
                              ["run `pdops rollback` to record it and check the stable slot"])
        previous = state.stable
        promoted = _decided(candidate, "promote", reasons, report).model_copy(update={"baseline": baseline})
        state.history, state.stable, state.candidate = appended(state.history, promoted), promoted, None
        self._save(state)  # intent first: rollback re-points the Service if the run dies before the switch
        self._switch(promoted, progress)
        if previous is not None and previous.colour != promoted.colour:
            self._retire(previous, promoted, progress)
        self._dry_candidate = None
        return promoted

    def rollback(self, reasons: list[str], report: str | None, progress: Progress, *, to_previous: bool = False) -> str:
        from workflows.targets.kube.readiness import rayservice_state
        state = self._state()
        done = []
        candidate = state.candidate or self._dry_candidate
        if candidate is not None:
            rs = self.kube.get("RayService", obj.rs_name(candidate))
            last = rayservice_state(rs).detail if rs is not None else "RayService absent"
            self._remove_colour(candidate, progress)  # before the record: a retry finds the candidate again
            said = any(last in r for r in reasons)  # a failed wait already quotes KubeRay's message: once is enough
            decided = _decided(candidate, "rollback",
                               reasons + ([] if said else [f"candidate state at rollback: {last}"]), report)
            state.history, state.candidate = appended(state.history, decided), None
            self._save(state)
            self._dry_candidate = None
            done.append(f"dropped candidate {candidate.short()} ({candidate.colour})")
        done.append(self._restore_previous(state, reasons, report, progress) if to_previous
                    else self._ensure_stable(state, progress))
        if not self.dry_run and (gone := self.remove_references(progress, "rollback")):   # a killed validate's
            done.append(f"removed leftover reference {', '.join(gone)}")
        return "; ".join(done)

    # ---- paths ----

    def _ensure_stable(self, state, progress: Progress) -> str:
        """The stable slot's RayService exists (redeployed from its record if not), the Service selects
        it, and no RayService of this release is left in the other colour."""
        stable = state.stable or last_good(state.history)
        if stable is None:
            return "no stable release recorded; nothing to restore"
        redeployed = ""
        rs = self.kube.get("RayService", obj.rs_name(stable))
        if rs is None or rs["metadata"].get("deletionTimestamp"):
            progress(f"[rollback] stable RayService {obj.rs_name(stable)} is missing; "
                     f"redeploying {stable.short()} from history")
            self._apply_release(stable, progress)
            if not self.dry_run:
                self._wait(stable, self.restore_timeout_s, progress)
            redeployed = "redeployed from history, "
        if self._service_colour(stable) != stable.colour:
            self._switch(stable, progress)
        other = stable.model_copy(update={"colour": other_colour(stable.colour)})
        if self.kube.get("RayService", obj.rs_name(other)) is not None:
            self._remove_colour(other, progress)
        return f"stable {stable.short()} ({stable.colour}) {redeployed}serving"

    def _restore_previous(self, state, reasons: list[str], report: str | None, progress: Progress) -> str:
        """Mark the current stable regressed and bring back the good release before it, validated by
        KubeRay readiness in the other colour before traffic moves."""
        current = state.stable
        if current is None:
            raise TargetError("no stable release to roll back from", ["`pdops status` shows what the cluster holds"])
        history = list(state.history)
        index = next((i for i in range(len(history) - 1, -1, -1)
                      if history[i].digest == current.digest and history[i].verdict == "promote"), None)
        if index is not None:
            history[index] = _decided(history[index], "regressed", reasons, report)
        previous = last_good(history)
        if previous is None:
            raise TargetError(f"no good release before {current.short()} in the history ConfigMap",
                              ["roll forward with a fixed release instead (`pdops rollout`)"])
        restore = previous.model_copy(update={"colour": other_colour(current.colour), "verdict": "pending",
                                              "applied_at": time.time(), "decided_at": None, "reasons": [],
                                              "report": None})
        self._check_capacity(restore, progress)
        state.history, state.stable = history, current.model_copy(update={"verdict": "regressed"})
        state.candidate = restore
        self._save(state)
        self._apply_release(restore, progress)
        if not self.dry_run:
            self._wait(restore, self.restore_timeout_s, progress)
        promoted = _decided(restore, "promote", [f"restored: {current.short()} regressed"] + reasons, report)
        state.history, state.stable, state.candidate = appended(state.history, promoted), promoted, None
        self._save(state)
        self._switch(promoted, progress)
        self._retire(current, promoted, progress)
        return f"{current.short()} marked regressed; {previous.short()} restored in {restore.colour} and serving"

    # ---- writes ----

    def _apply_release(self, record: ReleaseRecord, progress: Progress) -> None:
        self._wait_gone(obj.rs_name(record), progress)
        for o in obj.release_objects(record, self.namespace):
            self._check_lock()
            self.kube.apply(o)
            progress(f"[rollout] applied {o['kind']}/{o['metadata']['name']}{' (dry run)' if self.dry_run else ''}")

    def _switch(self, record: ReleaseRecord, progress: Progress) -> None:
        self._check_lock()
        service = obj.stable_service(record, self.namespace)
        self.kube.apply(service)
        progress(f"[promote] Service {service['metadata']['name']} now selects {record.colour} "
                 f"({obj.rs_name(record)}, {record.short()}){' (dry run)' if self.dry_run else ''}")

    def _retire(self, old: ReleaseRecord, new: ReleaseRecord, progress: Progress) -> None:
        """Delete the old colour once the Service routes to the new one only, after a grace period."""
        if not self.dry_run and not traffic.drain(self.kube, obj.service_name(new), new.colour, self.drain_grace_s,
                                                  min(self.restore_timeout_s, DRAIN_TIMEOUT_S), self.poll_s, progress):
            progress(f"[promote] kept {obj.rs_name(old)}: users may still reach it; the next rollout or "
                     "`pdops rollback` removes it")
            return
        self._remove_colour(old, progress, "promote")  # frees its GPUs; history can redeploy it

    def _service_colour(self, record: ReleaseRecord) -> str | None:
        service = self.kube.get("Service", obj.service_name(record))
        return ((service or {}).get("spec") or {}).get("selector", {}).get(COLOUR_LABEL)

    def _remove_colour(self, record: ReleaseRecord, progress: Progress, step: str = "rollback") -> None:
        """Delete a colour's RayService and PDBs (KubeRay deletes its RayCluster and pods)."""
        for o in obj.release_objects(record, self.namespace):
            if o["kind"] in obj.SHARED_KINDS:
                continue
            self._check_lock()
            if self.kube.delete(o["kind"], o["metadata"]["name"]):
                progress(f"[{step}] deleted {o['kind']}/{o['metadata']['name']}{' (dry run)' if self.dry_run else ''}")


def _decided(record: ReleaseRecord, verdict: str, reasons: list[str], report: str | None) -> ReleaseRecord:
    return record.model_copy(update={"verdict": verdict, "reasons": list(reasons), "report": report,
                                     "decided_at": time.time()})
