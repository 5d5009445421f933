"""Moving releases between the slots: rollout, promote, rollback (the Kubernetes target's write paths).

A mixin of KubernetesTarget (target.py), which supplies the API (`kube`), state (`_state`, `_save`),
readiness (`_wait`, `_wait_gone`) and the capacity check. Every path that applies a colour's
RayService first waits for an earlier one of that name to finish terminating (KubeRay's
finalizer), and every path that deletes a colour drains the Service first.

Each step is idempotent and resumable: a retry after a failure at any write (500, 409, a 504 whose
write landed, the process killed) converges to one safe state (tests/unit/test_kube_idempotent.py
injects a fault at every write in turn). The rules that make it so:
- The colour the user-facing Service selects is sacred. Nothing deletes it or applies another
  release over it (`_remove_colour`, `_apply_release` read the selector first); rollout picks the
  other colour; a rollback whose candidate users already reach (a promote died after switching)
  moves them back to the stable colour, ready first and drained after, before deleting it.
- Users move first, the history follows: promote and restore switch the Service to the validated
  colour, then record it, then retire the old colour. A retry after the switch finds the candidate
  still pending and completes the record; a retry after the record finds nothing pending and
  finishes retiring the old colour (or says the promote is complete).
- Deletes carry the uid of the object read (DeleteOptions preconditions.uid): an object of the same
  name created since is not deleted; the API server answers 409 Conflict (kubernetes
  staging/src/k8s.io/apiserver/pkg/storage/interfaces.go Preconditions.Check -> NewInvalidObjError,
  mapped to errors.NewConflict by storage/errors/storage.go InterpretDeleteError), which api.py
  treats as transient: the retry reads again and decides again.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from workflows.names import COLOUR_LABEL, DIGEST_ANNOTATION
from workflows.spec.release import DRAIN_ROUTE_S
from workflows.targets.base import Progress, ReleaseRecord, TargetError, appended, last_good, other_colour
from workflows.targets.kube import objects as obj, traffic
from workflows.targets.kube.readiness import rayservice_state

if TYPE_CHECKING:
    from workflows.targets.kube.history import State



class Slots:
    kube: Any
    dry_run: bool
    namespace: str
    restore_timeout_s: float
    drain_grace_s: float
    poll_s: float
    _dry_candidate: ReleaseRecord | None
    _dry_selected: str | None = None   # dry runs store nothing: the colour this run's own switch selected

    if TYPE_CHECKING:  # supplied by KubernetesTarget (target.py); declared here for the type checker only
        def _state(self, release: str | None = None) -> State: ...
        def _save(self, state: State) -> None: ...
        def _check_lock(self) -> None: ...
        def _candidate(self, state: State) -> ReleaseRecord: ...
        def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress) -> None: ...
        def _wait_gone(self, name: str, progress: Progress, step: str = "rollout") -> None: ...
        def _bound(self, timeout_s: float) -> float: ...
        def _check_capacity(self, candidate: ReleaseRecord, progress: Progress) -> None: ...
        def remove_references(self, progress: Progress, step: str = "reference") -> list[str]: ...
        def remove_baselines(self, progress: Progress, step: str = "baseline") -> list[str]: ...

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
        if state.stable is not None and self._selected(state.stable) not in (None, state.stable.colour):
            # the history's stable is not what users reach (a promote of an older pdops recorded before
            # switching): finish it, so the colour picked below is never the one users are on
            progress(f"[rollout] Service {obj.service_name(state.stable)} selects {self._selected(state.stable)}, "
                     f"the stable release is in {state.stable.colour}: pointing users at it first")
            self._ensure_stable(state, progress)
        colour = other_colour(state.stable.colour) if state.stable else "blue"
        candidate = record.model_copy(update={"colour": colour, "verdict": "pending", "applied_at": time.time(),
                                              "reasons": [], "decided_at": None})
        obj.check(candidate, self.namespace)
        self._clear_colour(candidate, progress, "rollout")
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
        candidate = state.candidate or self._dry_candidate
        if candidate is None:
            return self._finish_promote(state, progress)
        if not (self.dry_run and candidate is self._dry_candidate):
            rs = self.kube.get("RayService", obj.rs_name(candidate))
            if rs is None:
                raise TargetError(f"the candidate's RayService {obj.rs_name(candidate)} is gone; nothing to promote",
                                  ["run `pdops rollback` to record it and check the stable slot"])
            found = rayservice_state(rs)
            if found.state != "ready":   # users are only ever moved to a colour that serves
                raise TargetError(f"the candidate {obj.rs_name(candidate)} is not serving ({found.detail}); "
                                  "users stay where they are", ["`pdops status` shows both slots; "
                                                                "`pdops rollback` drops the candidate"])
        promoted = _decided(candidate, "promote", reasons, report).model_copy(update={"baseline": baseline})
        self._complete(state, promoted, state.stable, progress)
        self._dry_candidate = None
        return promoted

    def rollback(self, reasons: list[str], report: str | None, progress: Progress, *, to_previous: bool = False,
                 regressed: str | None = None) -> str:
        """`regressed` (with to_previous): the release the caller found regressed (ReleaseRecord.named);
        a retry after that release was already replaced says so instead of regressing the restored one too."""
        state = self._state()
        done = []
        candidate = state.candidate or self._dry_candidate
        if candidate is not None and not (to_previous and _is_restore(state, candidate)):
            done.append(self._drop(state, candidate, reasons, report, progress))
        done.append(self._restore_previous(state, reasons, report, progress, regressed) if to_previous
                    else self._ensure_stable(state, progress))
        if not self.dry_run and (gone := self.remove_references(progress, "rollback")):   # a killed validate's
            done.append(f"removed leftover reference {', '.join(gone)}")
        if not self.dry_run and (gone := self.remove_baselines(progress, "rollback")):    # likewise (baseline.py)
            done.append(f"removed leftover baseline {', '.join(gone)}")
        return "; ".join(done)

    # ---- paths ----

    def _complete(self, state: State, promoted: ReleaseRecord, previous: ReleaseRecord | None,
                  progress: Progress) -> None:
        """Users first, then the record, then the old colour (module docstring): every prefix of this
        is a state a retry completes."""
        self._switch(promoted, progress)
        state.history, state.stable, state.candidate = appended(state.history, promoted), promoted, None
        self._save(state)
        if previous is not None and previous.colour != promoted.colour:
            self._retire(previous, promoted, progress)

    def _finish_promote(self, state: State, progress: Progress) -> ReleaseRecord:
        """Promote with nothing pending: after a promote (or restore) was recorded, finish what is
        left of it (the switch, the old colour's removal) or say it is complete; else nothing to promote."""
        stable, last = state.stable, (state.history[-1] if state.history else None)
        if stable is None or last is None or (last.verdict, last.digest) != ("promote", stable.digest):
            raise TargetError(f"no candidate is pending in namespace {self.namespace}", ["run `pdops rollout` first"])
        left = self._ensure_stable(state, progress)
        progress(f"[promote] nothing pending: {stable.short()} was the last release promoted; {left}")
        return stable

    def _drop(self, state: State, candidate: ReleaseRecord, reasons: list[str], report: str | None,
              progress: Progress) -> str:
        """Remove a pending candidate, then record it rolled back (until then a retry finds it again)."""
        rs = self.kube.get("RayService", obj.rs_name(candidate))
        last = rayservice_state(rs).detail if rs is not None else "RayService absent"
        if self._selected(candidate) == candidate.colour:   # a promote died after moving users to it
            if state.stable is None:
                raise TargetError(f"Service {obj.service_name(candidate)} already routes users to the candidate "
                                  f"{candidate.short()} and no stable release is recorded to move them back to",
                                  ["`pdops promote` finishes the promote that moved them (it passed the gate)"])
            progress(f"[rollback] users reach the candidate {candidate.short()} ({candidate.colour}): "
                     f"moving them back to {state.stable.short()} first")
            self._ensure_stable(state, progress)   # stable ready, selected, drained; the candidate's colour deleted
        else:
            self._remove_colour(candidate, progress, uid=(rs or {}).get("metadata", {}).get("uid"))
        said = any(last in r for r in reasons)  # a failed wait already quotes KubeRay's message: once is enough
        decided = _decided(candidate, "rollback", reasons + ([] if said else [f"candidate state at rollback: {last}"]),
                           report)
        state.history, state.candidate = appended(state.history, decided), None
        self._save(state)
        self._dry_candidate = None
        return f"dropped candidate {candidate.short()} ({candidate.colour})"

    def _ensure_stable(self, state: State, progress: Progress) -> str:
        """The stable slot's RayService exists (redeployed from its record if not) and serves, the
        Service selects it, and the other colour is drained and deleted."""
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
        if self._selected(stable) != stable.colour:
            if not self.dry_run:
                self._wait(stable, self.restore_timeout_s, progress)   # users only move to a colour that serves
            self._switch(stable, progress)
        other = stable.model_copy(update={"colour": other_colour(stable.colour)})
        if self.kube.get("RayService", obj.rs_name(other)) is not None:
            self._retire(other, stable, progress, "rollback")   # drained first: streams on it finish
        return f"stable {stable.short()} ({stable.colour}) {redeployed}serving"

    def _restore_previous(self, state: State, reasons: list[str], report: str | None, progress: Progress,
                          regressed: str | None) -> str:
        """Mark the current stable regressed and bring back the good release before it, validated by
        KubeRay readiness in the other colour before traffic moves. Resumes a restore an earlier try left."""
        current = state.stable
        if current is None:
            raise TargetError("no stable release to roll back from", ["`pdops status` shows what the cluster holds"])
        if regressed and not current.named(regressed):
            if not any(r.named(regressed) and r.verdict == "regressed" for r in state.history):
                raise TargetError(f"the stable slot holds {current.short()}, not {regressed} (the release found "
                                  "regressed)", ["`pdops status` shows what serves; validate it again"])
            left = self._ensure_stable(state, progress)   # a retry after the restore was recorded
            return f"{regressed} was already marked regressed; {left}"
        restore = state.candidate
        if restore is not None and _is_restore(state, restore):
            progress(f"[rollback] resuming the restore of {restore.short()} in {restore.colour}")
        else:
            restore = self._start_restore(state, current, reasons, report, progress)
        current = state.stable or current
        self._apply_release(restore, progress)
        if not self.dry_run:
            self._wait(restore, self.restore_timeout_s, progress)
        promoted = _decided(restore, "promote", [f"restored: {current.short()} regressed"] + reasons, report)
        self._complete(state, promoted, current, progress)
        return f"{current.short()} marked regressed; {restore.short()} restored in {restore.colour} and serving"

    def _start_restore(self, state: State, current: ReleaseRecord, reasons: list[str], report: str | None,
                       progress: Progress) -> ReleaseRecord:
        """Record the intent: the current stable regressed, the good release before it pending as the candidate."""
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
        self._clear_colour(restore, progress, "rollback")
        self._check_capacity(restore, progress)
        state.history, state.stable = history, current.model_copy(update={"verdict": "regressed"})
        state.candidate = restore
        self._save(state)
        return restore

    # ---- writes ----

    def _clear_colour(self, record: ReleaseRecord, progress: Progress, step: str) -> None:
        """A RayService of another release left in `record`'s colour (a run that died after promote,
        or one still terminating after a rollback) goes first: applying over it would upgrade it in place."""
        rs = self.kube.get("RayService", obj.rs_name(record))
        if rs is None or rs["metadata"].get("deletionTimestamp"):
            return
        if (rs["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) != record.digest:
            progress(f"[{step}] removing leftover RayService {obj.rs_name(record)} (not recorded in any slot)")
            self._remove_colour(record, progress, step, uid=rs["metadata"].get("uid"))
            self._wait_gone(obj.rs_name(record), progress, step)

    def _apply_release(self, record: ReleaseRecord, progress: Progress) -> None:
        self._wait_gone(obj.rs_name(record), progress)
        if self._selected(record) == record.colour:   # users are on this colour: only its own release again
            rs = self.kube.get("RayService", obj.rs_name(record))
            held = ((rs or {}).get("metadata", {}).get("annotations") or {}).get(DIGEST_ANNOTATION)
            if rs is not None and held != record.digest:
                raise TargetError(f"refusing to apply {record.short()} over {obj.rs_name(record)}: Service "
                                  f"{obj.service_name(record)} routes users to it (it holds {held})",
                                  ["`pdops status` shows what serves; `pdops rollback` converges the slots"])
        for o in obj.release_objects(record, self.namespace):
            self._check_lock()
            self.kube.apply(o)
            progress(f"[rollout] applied {o['kind']}/{o['metadata']['name']}{' (dry run)' if self.dry_run else ''}")

    def _switch(self, record: ReleaseRecord, progress: Progress) -> None:
        self._check_lock()
        service = obj.stable_service(record, self.namespace)
        self.kube.apply(service)
        if self.dry_run:
            self._dry_selected = record.colour
        progress(f"[promote] Service {service['metadata']['name']} now selects {record.colour} "
                 f"({obj.rs_name(record)}, {record.short()}){' (dry run)' if self.dry_run else ''}")

    def _retire(self, old: ReleaseRecord, new: ReleaseRecord, progress: Progress, step: str = "promote") -> None:
        """Delete the old colour once the Service routes to the new one only, after a grace period."""
        route_s = self._bound(min(self.restore_timeout_s, DRAIN_ROUTE_S))
        if not self.dry_run and not traffic.drain(self.kube, obj.service_name(new), new.colour, self.drain_grace_s,
                                                  route_s, self.poll_s, progress):
            progress(f"[{step}] kept {obj.rs_name(old)}: users may still reach it; the next rollout or "
                     "`pdops rollback` removes it")
            return
        self._remove_colour(old, progress, step)  # frees its GPUs; history can redeploy it

    def _service_colour(self, record: ReleaseRecord) -> str | None:
        service = self.kube.get("Service", obj.service_name(record))
        return ((service or {}).get("spec") or {}).get("selector", {}).get(COLOUR_LABEL)

    def _selected(self, record: ReleaseRecord) -> str | None:
        """The colour users reach: the Service's selector (in a dry run, as this run's own switch left it)."""
        if self.dry_run and self._dry_selected is not None:
            return self._dry_selected
        return self._service_colour(record)

    def _remove_colour(self, record: ReleaseRecord, progress: Progress, step: str = "rollback",
                       uid: str | None = None) -> None:
        """Delete a colour's RayService and PDBs (KubeRay deletes its RayCluster and pods), never the colour
        the Service selects. Each delete carries the uid read (`uid`: the RayService the caller decided on)."""
        if self._selected(record) == record.colour:
            raise TargetError(f"refusing to delete {obj.rs_name(record)}: Service {obj.service_name(record)} "
                              "routes users to it", ["`pdops status` shows what serves; `pdops rollback` "
                                                     "moves users to the stable slot first"])
        for o in obj.release_objects(record, self.namespace):
            if o["kind"] in obj.SHARED_KINDS:
                continue
            self._check_lock()
            name = o["metadata"]["name"]
            found = self.kube.get(o["kind"], name)
            if found is None or found["metadata"].get("deletionTimestamp"):
                continue
            want = uid if o["kind"] == "RayService" and uid else found["metadata"].get("uid")
            if self.kube.delete(o["kind"], name, uid=want):
                progress(f"[{step}] deleted {o['kind']}/{name}{' (dry run)' if self.dry_run else ''}")


def _decided(record: ReleaseRecord, verdict: str, reasons: list[str], report: str | None) -> ReleaseRecord:
    return record.model_copy(update={"verdict": verdict, "reasons": list(reasons), "report": report,
                                     "decided_at": time.time()})


def _is_restore(state: State, candidate: ReleaseRecord) -> bool:
    """The pending candidate is a restore an earlier `rollback --to-previous` recorded and did not finish."""
    good = last_good(state.history)
    return (state.stable is not None and state.stable.verdict == "regressed" and good is not None
            and good.digest == candidate.digest and candidate.colour != state.stable.colour)
