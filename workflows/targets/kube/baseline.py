"""vs_stable's baseline on the cluster: a short-lived RayService `<name>-baseline` of the stable render.

The candidate is compared with the stable release given the same synthetic load in the same window
(validation/interleave.py), never with the user-facing Service: that one carries users' traffic,
which slows stable and leans the comparison toward the candidate (Kayenta, Spinnaker's canary
analysis, likewise starts a fresh baseline of the current release beside the canary rather than
comparing with production). The baseline is the stable record's RayService exactly as rendered
(same groups, replicas, resources, serve config: the same size), renamed `<name>-baseline`, in the
colour `baseline`: the stable Service selects `pdops.dev/colour=<blue|green>` (objects.stable_service),
so it never routes a user to these pods, and a colour's PDBs and metrics never count them. The
benchmark reaches it at KubeRay's `<name>-baseline-serve-svc`, which nobody else is told of; every
block still checks the engines' request counter for foreign requests (validation.interleave.foreign_requests).
It is labelled `pdops.dev/role=baseline` (pod templates too), how status, rollback and the next
run find one a killed run left behind.

Lifecycle (Baselines.baseline_server): remove a leftover, check room for its pods (capacity.py;
candidate and stable hold theirs meanwhile), apply, wait for KubeRay's RUNNING and a ready endpoint
of its serve Service, yield it, then delete it (uid precondition: never another run's) and wait
until KubeRay's finalizer lets it go, on success, failure and exception alike. A validate step killed
outright runs no finally: `pdops rollback` (the release workflow's rollback step and its exit
handler, `rollback --if-candidate-pending`) and the next run's baseline remove it (remove_baselines:
idempotent, a no-op when none is left). No room or never ready: Skipped(why); the gate then fails
vs_stable closed, or skips it under `slo.vs_stable.without_baseline: absolute_only`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from validation.interleave import foreign_requests
from workflows.names import ROLE_LABEL
from workflows.targets.base import Baseline, Progress, ReleaseRecord, Skipped
from workflows.targets.kube import objects as obj, traffic

ROLE = COLOUR = "baseline"


def as_baseline(record: ReleaseRecord) -> ReleaseRecord:
    """The stable record in the baseline's colour: what objects.py and traffic.py name and select by."""
    return record.model_copy(update={"colour": COLOUR})


def name_of(record: ReleaseRecord) -> str:
    return obj.rs_name(as_baseline(record))


def rayservice(record: ReleaseRecord, namespace: str) -> dict[str, Any]:
    """The baseline RayService for `record` (the stable release): its RayService as a rollout applies
    it, in the colour `baseline`, labelled with the role (module docstring)."""
    rs = next(o for o in obj.release_objects(as_baseline(record), namespace) if o["kind"] == "RayService")
    rs["metadata"]["labels"][ROLE_LABEL] = ROLE
    cluster = rs["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *(cluster.get("workerGroupSpecs") or [])]:
        group["template"]["metadata"]["labels"][ROLE_LABEL] = ROLE
    rs["spec"]["upgradeStrategy"] = {"type": "None"}   # never upgraded in place: deleted after the block
    return rs


class Baselines:
    """Mixin of KubernetesTarget (target.py supplies kube, the lock and the capacity check; reference.References
    the wait for a role's RayService, its removal and deletion, shared with the reference)."""

    kube: Any
    namespace: str
    dry_run: bool
    metrics_lag_s: float | None
    _check_lock: Callable[[], None]
    _room: Callable[..., list[str]]
    _delete_owned: Callable[..., None]                   # reference.References
    _wait_role: Callable[[str, str, Progress], str]      # reference.References
    _remove_role: Callable[[str, Progress, str], list[str]]   # reference.References

    @contextmanager
    def baseline_server(self, record: ReleaseRecord, progress: Progress) -> Iterator[Baseline | Skipped]:
        name = name_of(record)
        if self.dry_run:
            progress(f"[baseline] dry run: RayService {name} is not created")
            yield Skipped("dry run: no baseline RayService created")
            return
        self.remove_baselines(progress)
        wanted = rayservice(record, self.namespace)
        short = self._room(wanted, progress, "baseline")
        if short:
            yield Skipped(f"no room for the baseline {name} (the stable render's size): " + "; ".join(short))
            return
        self._check_lock()
        uid = self.kube.apply(wanted)["metadata"]["uid"]
        progress(f"[baseline] applied RayService/{name}: {record.short()} at its own size, for the benchmark only")
        try:
            why = self._wait_role(name, ROLE, progress)
            yield Skipped(why) if why else Baseline(
                endpoint=traffic.endpoint(self.kube, "candidate", as_baseline(record), self.metrics_lag_s),
                release=record.short(), void_reason=foreign_requests,
                how=f"RayService {name}, the stable render at its own size, reached only by the benchmark")
        finally:
            self._delete_owned(name, uid, progress, "baseline")

    def remove_baselines(self, progress: Progress, step: str = "baseline") -> list[str]:
        """Delete every baseline RayService in the namespace (a killed run's) and wait until gone.
        Idempotent: with none left it does nothing."""
        return self._remove_role(ROLE, progress, step)
