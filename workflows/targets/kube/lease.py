"""The release lock: a coordination.k8s.io Lease, taken and renewed the way client-go's leader election does
(kubernetes/client-go tools/leaderelection/leaderelection.go).

- every write is an Update (PUT) of the Lease as last read, so it carries that resourceVersion:
  if anyone wrote in between, the API server answers 409 and the write is lost, never a silent
  overwrite (tryAcquireOrRenew step 4, resourcelock/leaselock.go Update);
- a Lease held by someone else counts as expired only after `leaseDurationSeconds` on OUR clock
  since we last saw its record change (isLeaseValid uses observedTime, set by setObservedRecord
  when the raw record differs): another host's renewTime is never compared with our clock. A
  renewal we watch happen proves the holder alive, so `acquire` reports it busy at once;
- the holder renews every RENEW_EVERY of the duration; renewals failing (or answered 409) for
  RENEW_DEADLINE of the duration mean the lock is lost (renew, RenewDeadline): `check()` then
  raises, so the release aborts before its next write;
- release deletes the Lease only if it is still ours, with a resourceVersion precondition
  (client-go's tryRelease empties the holder by an Update; a delete keeps no stale object).
"""
from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from workflows.names import LOCK_NAME, PART_OF
from workflows.targets.base import Progress, TargetError
from workflows.targets.kube.api import Conflict, Kube

LEASE_S = 120          # a dead holder's lock is taken over this long after its record last changed (our clock)
RENEW_EVERY = 0.25     # renew every quarter of the duration ...
RENEW_DEADLINE = 2 / 3  # ... and give the lock up when renewals failed for two thirds of it (client-go 10 s of 15 s)


def run_holder(run_id: str) -> str:
    """The Lease holder of an Argo run: every step of the run holds it under this name."""
    return f"run {run_id}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ReleaseLock:
    def __init__(self, kube: Kube, holder: str, lease_s: float = LEASE_S, poll_s: float = 1.0) -> None:
        self.kube, self.holder, self.lease_s, self.poll_s = kube, holder, lease_s, poll_s
        self._lease: dict[str, Any] | None = None   # as last written by us (its resourceVersion is the precondition)
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spec(self, acquired: str | None = None, transitions: int = 0) -> dict[str, Any]:
        now = _now()
        return {"holderIdentity": self.holder, "leaseDurationSeconds": max(1, round(self.lease_s)),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def acquire(self, progress: Progress, max_wait_s: float | None = None, renew: bool = True) -> None:
        """Take the Lease (waiting while another holder's record keeps unchanged, then taking it over).
        `max_wait_s`: give up sooner, naming the holder. `renew=False`: take it and leave it (a run's first
        step: its later steps renew it, `pdops run end` releases it)."""
        observed, observed_at, started = None, time.monotonic(), time.monotonic()
        while True:
            lease = self.kube.get("Lease", LOCK_NAME)
            if lease is None:
                try:
                    self._lease = self.kube.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                    "metadata": {"name": LOCK_NAME, "namespace": self.kube.namespace,
                                                                 "labels": dict(PART_OF)}, "spec": self._spec()})
                    break
                except Conflict:
                    continue  # created by someone else in between: read it
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            if observed is not None and spec != observed:
                if holder and holder != self.holder:
                    raise self._busy(holder, "it renewed the lock while we watched")
            if spec != observed:
                observed, observed_at = spec, time.monotonic()
                if holder and holder != self.holder:
                    progress(f"[lock] Lease {LOCK_NAME} is held by {holder}; taking it over if it does not change for "
                             f"{float(spec.get('leaseDurationSeconds') or self.lease_s):.0f}s")
            expired = time.monotonic() - observed_at >= float(spec.get("leaseDurationSeconds") or self.lease_s)
            if not holder or holder == self.holder or expired:
                lease["spec"] = self._spec(transitions=int(spec.get("leaseTransitions") or 0) + (holder != self.holder))
                try:
                    self._lease = self.kube.replace(lease)  # carries the resourceVersion we read
                    if holder and holder != self.holder:
                        progress(f"[lock] took over Lease {LOCK_NAME} from {holder} "
                                 f"(unchanged for {self.lease_s:.0f}s)")
                    break
                except Conflict:
                    continue  # someone wrote in between: read again
            if max_wait_s is not None and time.monotonic() - started >= max_wait_s:
                raise self._busy(holder, f"still held after waiting {max_wait_s:.0f}s")
            time.sleep(self.poll_s)
        if renew:
            self._start_renewing()

    def hold(self) -> None:
        """A later step of the run that took the Lease: renew it and keep renewing, or fail naming who holds
        it (nothing is written without it)."""
        lease = self.kube.get("Lease", LOCK_NAME)
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if lease is None or holder != self.holder:
            raise TargetError(f"{self.holder} does not hold the release lock of namespace {self.kube.namespace}",
                              [f"holder: {holder or 'nobody'} (Lease {LOCK_NAME}); nothing was written",
                               "the run's first step (`pdops run start`) takes it; a run that lost it (another took "
                               f"it over after {self.lease_s:.0f}s without renewal) must start again"])
        lease["spec"] = self._spec(acquired=spec.get("acquireTime"), transitions=int(spec.get("leaseTransitions") or 0))
        try:
            self._lease = self.kube.replace(lease)
        except Conflict:
            raise self._busy("unknown", "the Lease changed while this step renewed it") from None
        self._start_renewing()

    def detach(self) -> None:
        """Stop renewing and leave the Lease held (the run's next step or `pdops run end` takes over)."""
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="pdops-lease", daemon=True)
        self._thread.start()

    def _busy(self, holder: str, why: str) -> TargetError:
        return TargetError(f"another release is running in namespace {self.kube.namespace}",
                           [f"holder: {holder} (Lease {LOCK_NAME}); {why}",
                            f"wait for it to finish; a holder that died loses the lock {self.lease_s:.0f}s "
                            "after it stops renewing"])

    def _renew_loop(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.lease_s * RENEW_EVERY):
            try:
                lease = dict(self._lease or {})
                lease["spec"] = self._spec(acquired=(lease.get("spec") or {}).get("acquireTime"),
                                           transitions=int((lease.get("spec") or {}).get("leaseTransitions") or 0))
                self._lease = self.kube.replace(lease)
                last_ok = time.monotonic()
            except Conflict:
                current = self.kube.get("Lease", LOCK_NAME) or {}
                taker = (current.get("spec") or {}).get("holderIdentity") or "nobody"
                self._lost = f"Lease {LOCK_NAME} was taken by {taker}"
                return
            except TargetError as exc:
                if time.monotonic() - last_ok >= self.lease_s * RENEW_DEADLINE:
                    self._lost = (f"could not renew Lease {LOCK_NAME} for {time.monotonic() - last_ok:.0f}s: "
                                  f"{exc.problem}")
                    return

    def check(self) -> None:
        """Raise when the lock is lost: the caller must not write anything more."""
        if self._lost:
            raise TargetError(f"the release lock was lost: {self._lost}",
                              ["another release may be changing this namespace; nothing more was written by this one",
                               "run `pdops status` to see what the cluster holds, then `pdops rollback` if needed"])

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._lost or self._lease is None:
            return
        try:  # only if still ours: a taker's Lease has another resourceVersion
            self.kube.delete("Lease", LOCK_NAME, resource_version=self._lease["metadata"]["resourceVersion"])
        except Conflict:
            pass
