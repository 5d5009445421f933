"""What a RayService's status says (KubeRay v1.7), and why a colour's pods are not serving.

Terminal failures end the wait at once with KubeRay's own message (ray-operator v1.7.0,
controllers/ray/rayservice_controller.go):
- condition Ready=False reason `ValidationFailed`: validateRayService rejected the spec; KubeRay
  builds nothing and retries only when the spec changes;
- condition Ready=False reason `InitializingTimeout`: the `ray.io/initializing-timeout`
  annotation expired; KubeRay deletes the clusters and never recovers (isInitializingTimeout);
- an application DEPLOY_FAILED in the active or pending service status.
An UNHEALTHY application is waited on: KubeRay v1.7 no longer replaces an unhealthy cluster
(`serviceUnhealthySecondThreshold` / `deploymentUnhealthySecondThreshold` are "Deprecated: This
field is not used anymore", apis/ray/v1/rayservice_types.go), so what bounds an unhealthy
candidate is pdops's rollout timeout (`wait_ready`), then validation.
"""
from __future__ import annotations

from typing import Any, Literal, NamedTuple

TERMINAL_REASONS = ("ValidationFailed", "InitializingTimeout")
FAILING_WAIT_REASONS = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                        "CreateContainerError", "RunContainerError", "InvalidImageName"}


class RayServiceState(NamedTuple):
    state: Literal["deploying", "ready", "failed"]
    detail: str          # e.g. "RUNNING", "DEPLOYING", "DEPLOY_FAILED: pd-llm: ..."
    terminal: bool       # waiting longer will not help


def rayservice_state(rs: dict[str, Any]) -> RayServiceState:
    """Ready = condition Ready True, no upgrade in progress, every active application RUNNING, status
    observed for the current generation, not being deleted."""
    status = rs.get("status") or {}
    if (rs.get("metadata") or {}).get("deletionTimestamp"):
        return RayServiceState("failed", "terminating (KubeRay is removing its RayClusters)", True)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready_cond = conditions.get("Ready", {})
    if ready_cond.get("status") == "False" and ready_cond.get("reason") in TERMINAL_REASONS:
        return RayServiceState("failed", f"{ready_cond['reason']}: {ready_cond.get('message') or 'no message'}", True)
    services = {"active": status.get("activeServiceStatus") or {}, "pending": status.get("pendingServiceStatus") or {}}
    apps = [(where, name, app) for where, svc in services.items()
            for name, app in (svc.get("applicationStatuses") or {}).items()]
    failed = [f"{name} ({where}): {app.get('message') or 'no message'}" for where, name, app in apps
              if app.get("status") == "DEPLOY_FAILED"]
    if failed:
        return RayServiceState("failed", "DEPLOY_FAILED: " + "; ".join(failed), True)
    active = [app.get("status") for where, _, app in apps if where == "active"]
    ready = ready_cond.get("status") == "True"
    upgrading = conditions.get("UpgradeInProgress", {}).get("status") == "True"
    generation, observed = (rs.get("metadata") or {}).get("generation"), status.get("observedGeneration")
    current = generation is None or observed is None or observed >= generation
    if ready and not upgrading and current and active and all(s == "RUNNING" for s in active):
        return RayServiceState("ready", "RUNNING", False)
    unhealthy = [f"{name}: {app.get('message') or 'no message'}" for _, name, app in apps
                 if app.get("status") == "UNHEALTHY"]
    if unhealthy:
        return RayServiceState("failed", "UNHEALTHY: " + "; ".join(unhealthy), False)
    seen = sorted({str(app.get("status")) for _, _, app in apps})
    return RayServiceState("deploying", "/".join(seen) or ready_cond.get("reason") or "waiting for KubeRay", False)


def pod_problems(pod: dict[str, Any]) -> list[str]:
    """Why a pod is not serving, in kubectl's words: unschedulable, crash-looping, image pulls."""
    name, status = pod.get("metadata", {}).get("name", "?"), pod.get("status") or {}
    out = []
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(f"pod {name}: {status.get('phase', 'Pending')}, {cond.get('reason', 'not scheduled')}: "
                       f"{cond.get('message', '')}".rstrip(": "))
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            last = ((cs.get("lastState") or {}).get("terminated") or {})
            died = f"; last exit: {last.get('reason', '?')} (code {last.get('exitCode', '?')})" if last else ""
            out.append(f"pod {name} container {cs.get('name')}: {waiting['reason']} "
                       f"(restarts {cs.get('restartCount', 0)}){died}"
                       + (f": {waiting['message']}" if waiting.get("message") else ""))
    if status.get("phase") == "Failed":
        out.append(f"pod {name}: Failed ({status.get('reason', '')}: {status.get('message', '')})")
    return out


def event_lines(events: list[dict[str, Any]], prefix: str, keep: int) -> list[str]:
    """The newest `keep` Events about objects named `prefix*` (RayService, RayCluster, pods), oldest first."""
    mine = [e for e in events if (e.get("involvedObject") or {}).get("name", "").startswith(prefix)]
    mine.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")
                                or e.get("metadata", {}).get("creationTimestamp") or ""))
    out = []
    for event in mine[-keep:]:
        obj = event.get("involvedObject") or {}
        out.append(f"event {event.get('type', '')} {event.get('reason', '')} "
                   f"{obj.get('kind', '')}/{obj.get('name', '')}: {event.get('message', '')}".strip())
    return out
