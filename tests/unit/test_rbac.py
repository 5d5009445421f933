"""Least privilege, pinned: every (role, apiGroup, resource, verb) granted in kustomize/argo/rbac.yaml
equals GRANTS below, so any widening fails here and has to be argued for in one place.

To grant more, add it to GRANTS with why the pipeline needs it (and to workflows/argo/rbac.py).
"""
from __future__ import annotations

import yaml

from tests.conftest import ROOT
from workflows.argo import definitions as argo

RBAC = ROOT / "kustomize" / "argo" / "rbac.yaml"
ENV = "<each environment namespace>"    # pd-release is bound in every ENV_NAMESPACES namespace

# (role, namespace, apiGroup, resource): verbs, why.
GRANTS: dict[tuple[str, str, str, str], tuple[set[str], str]] = {
    ("pd-release", ENV, "ray.io", "rayservices"): (
        {"get", "list", "watch", "create", "patch", "update", "delete"},
        "rollout creates the candidate RayService, promote/rollback switch and delete colours; validate creates the "
        "single-engine reference `<name>-reference`, lists leftovers by label and deletes it (delete with a uid "
        "precondition: workflows/targets/kube/reference.py)"),
    ("pd-release", ENV, "ray.io", "rayservices/status"): ({"get"}, "wait until the candidate is RUNNING"),
    ("pd-release", ENV, "", "services"): (
        {"get", "list", "patch", "create"}, "the stable Service is created once and re-pointed on promote"),
    ("pd-release", ENV, "", "configmaps"): (
        {"get", "list", "create", "patch", "update", "delete"},
        "release history and the record of the stable release (server-side apply = patch), which also caches "
        "the golden answers (update with the resourceVersion read: workflows/targets/kube/golden_cache.py); "
        "delete retires `pdops-golden-<release>`, where an earlier pdops cached them (golden_cache.retire_legacy, "
        "with a uid precondition; update already lets the step rewrite any ConfigMap here)"),
    ("pd-release", ENV, "", "events"): ({"list"}, "say why a candidate is not becoming ready"),
    ("pd-release", ENV, "", "pods"): ({"get", "list"}, "readiness and restarts of the candidate's (and the "
                                                        "reference's, by label) pods"),
    ("pd-release", ENV, "", "serviceaccounts"): (
        {"get", "create", "patch"}, "the rendered release includes its ServiceAccount"),
    ("pd-release", ENV, "policy", "poddisruptionbudgets"): (
        {"get", "create", "patch", "delete"}, "one PDB per phase, applied and removed with its colour"),
    ("pd-release", ENV, "monitoring.coreos.com", "podmonitors"): (
        {"get", "create", "patch"}, "the monitoring component's PodMonitor"),
    ("pd-release", ENV, "coordination.k8s.io", "leases"): (
        {"get", "create", "update", "delete"},
        "a Lease keeps two releases of one environment apart: written by update with the resourceVersion read "
        "(client-go leader election), deleted with a resourceVersion precondition"),
    ("pd-release", ENV, "discovery.k8s.io", "endpointslices"): (
        {"list"}, "promote drains: the old colour is deleted once the stable Service's endpoints are the new colour's; "
                  "the reference is used once KubeRay's `<rs>-serve-svc` has a ready endpoint"),
    ("pd-release-executor", argo.WORKFLOW_NAMESPACE, "argoproj.io", "workflowtaskresults"): (
        {"create", "patch"}, "the Argo executor reports step outputs"),
    # The git-push Sensor submits pd-release, nothing else. Each verb is what upstream code calls with
    # the Sensor's service account (argo-events v1.9.11, argo-workflows v4.0.10):
    ("pd-release-sensor", argo.WORKFLOW_NAMESPACE, "argoproj.io", "workflows"): (
        {"create", "list"},
        "create: `argo submit` -> server/workflow/workflow_server.go CreateWorkflow; list: the trigger "
        "then lists by its labels, pkg/sensors/triggers/argo-workflow/argo-workflow.go Execute"),
    ("pd-release-sensor", argo.WORKFLOW_NAMESPACE, "argoproj.io", "workflowtemplates"): (
        {"get"}, "CreateWorkflow -> validate.ValidateWorkflow resolves workflowTemplateRef through "
                 "workflow/templateresolution WrapWorkflowTemplateInterface (a GET)"),
}
# Read-only secrets access is not granted at all: the API key and webhook secret reach pods as
# secretKeyRef env, which the kubelet resolves; no step reads a Secret through the API.


def docs():
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def granted() -> dict[tuple[str, str, str, str], set[str]]:
    out: dict[tuple[str, str, str, str], set[str]] = {}
    for role in (d for d in docs() if d["kind"] == "Role"):
        ns = role["metadata"]["namespace"]
        ns = ENV if ns in argo.ENV_NAMESPACES.values() else ns
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule       # no resourceNames/nonResourceURLs
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((role["metadata"]["name"], ns, group, resource), set()).update(rule["verbs"])
    return out


def test_grants_are_exactly_the_pinned_set():
    assert granted() == {k: verbs for k, (verbs, _) in GRANTS.items()}


def test_only_namespaced_roles_bound_to_our_service_accounts():
    kinds = {d["kind"] for d in docs()}
    assert kinds == {"ServiceAccount", "Role", "RoleBinding"}                 # no Cluster* anywhere
    roles = {(d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs() if d["kind"] == "Role"}
    for b in (d for d in docs() if d["kind"] == "RoleBinding"):
        assert b["roleRef"]["kind"] == "Role"
        assert (b["roleRef"]["name"], b["metadata"]["namespace"]) in roles
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["namespace"] == argo.WORKFLOW_NAMESPACE
    release_namespaces = {ns for name, ns in roles if name == argo.SERVICE_ACCOUNT}
    assert release_namespaces == set(argo.ENV_NAMESPACES.values())


def test_no_wildcards_secrets_or_escalation():
    for (role, _, group, resource), verbs in granted().items():
        assert "*" not in {group, resource} | verbs, role
        assert resource not in {"secrets", "roles", "rolebindings", "clusterroles", "clusterrolebindings",
                                "pods/exec", "pods/attach", "serviceaccounts/token", "nodes", "namespaces"}, resource
        assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}, (role, resource)
