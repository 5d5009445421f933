"""RBAC of the pipeline: namespaced only, least privilege.

- ServiceAccount `pd-release` (workflow namespace) runs every pd-release / pd-canary step.
- Role `pd-release` in each environment namespace: what rollout/promote/rollback/compat/bench need.
- Role `pd-release-executor` in the workflow namespace: what the Argo executor needs to report
  step outputs (workflowtaskresults), nothing else.
- ServiceAccount + Role `pd-release-sensor`: the Argo Events sensor may submit pd-release (create and list
  Workflows, get the WorkflowTemplate), nothing else.
"""
from __future__ import annotations

from typing import Any

from workflows.names import (
    ENV_NAMESPACES,
    EXECUTOR_ROLE,
    PART_OF,
    SENSOR_SERVICE_ACCOUNT,
    SERVICE_ACCOUNT,
    WORKFLOW_NAMESPACE,
)

RELEASE_RULES: list[dict[str, Any]] = [
    # rayservices also cover the single-engine reference `<name>-reference` the validate step applies,
    # lists (by label) and deletes. configmaps: the release history, which also caches the golden answers
    # (targets/kube/history.py, golden_cache.py); delete only retires the ConfigMap `pdops-golden-<release>`
    # an earlier pdops cached them in (golden_cache.retire_legacy; update already lets a step rewrite any)
    {"apiGroups": ["ray.io"], "resources": ["rayservices"],
     "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayservices/status"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "patch", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "patch", "update", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    # The rest of a rendered release (workflows/targets/kube/ applies it with the RayService)
    # and the Lease that keeps two releases of one environment apart.
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "delete"]},
    # promote waits until the stable Service routes to the new colour only before deleting the old one
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
]
EXECUTOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
]
# Exactly what Argo Events v1.9.11's argoWorkflow trigger (operation submit) calls with the Sensor's
# service account (pkg/sensors/triggers/argo-workflow/argo-workflow.go, Execute): `argo -n NS submit
# FILE`, which in argo v4.0.10 (cmd/argo/commands/submit.go submitWorkflows -> server/workflow/
# workflow_server.go CreateWorkflow) validates the Workflow, resolving its workflowTemplateRef with a
# GET of the WorkflowTemplate (workflow/templateresolution WrapWorkflowTemplateInterface), then creates
# it; the trigger then LISTs workflows by its own labels to return what it created. The CLI's
# ClusterWorkflowTemplate access check (util/rbac HasAccessToClusterWorkflowTemplates) is a
# SelfSubjectAccessReview, which Kubernetes allows every authenticated user (system:basic-user):
# without cluster-template access the CLI uses a null getter, which pd-release never needs.
SENSOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create", "list"]},
    {"apiGroups": ["argoproj.io"], "resources": ["workflowtemplates"], "verbs": ["get"]},
]
LABELS = PART_OF


def _sa(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": WORKFLOW_NAMESPACE, "labels": dict(LABELS)}}


def _role(name: str, namespace: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)},
            "rules": [dict(r) for r in rules]}


def _binding(name: str, namespace: str, sa: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": WORKFLOW_NAMESPACE}]}


def objects() -> list[dict[str, Any]]:
    out = [_sa(SERVICE_ACCOUNT)]
    for ns in ENV_NAMESPACES.values():
        out += [_role(SERVICE_ACCOUNT, ns, RELEASE_RULES), _binding(SERVICE_ACCOUNT, ns, SERVICE_ACCOUNT)]
    out += [_role(EXECUTOR_ROLE, WORKFLOW_NAMESPACE, EXECUTOR_RULES),
            _binding(EXECUTOR_ROLE, WORKFLOW_NAMESPACE, SERVICE_ACCOUNT)]
    out += [_sa(SENSOR_SERVICE_ACCOUNT), _role(SENSOR_SERVICE_ACCOUNT, WORKFLOW_NAMESPACE, SENSOR_RULES),
            _binding(SENSOR_SERVICE_ACCOUNT, WORKFLOW_NAMESPACE, SENSOR_SERVICE_ACCOUNT)]
    return out
