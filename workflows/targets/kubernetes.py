"""The Kubernetes target (implemented in workflows/targets/kube/; this name is kept for its importers)."""
from __future__ import annotations

from workflows.targets.kube.readiness import RayServiceState, rayservice_state
from workflows.targets.kube.target import KubernetesTarget

__all__ = ["KubernetesTarget", "RayServiceState", "rayservice_state"]
