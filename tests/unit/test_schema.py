"""Pinned-schema validation: CRDs in strict mode with CEL rules, Argo Events schema.json, core kinds."""
from __future__ import annotations

import copy

import pytest

from workflows.checks.schema import schema_dir_from_env, validate_objects
from workflows.errors import InputError

SCHEMAS = schema_dir_from_env()

if not SCHEMAS.is_dir():
    pytest.skip(f"pinned schemas not found at {SCHEMAS}", allow_module_level=True)

CONTAINER = {"name": "ray", "image": "rayproject/ray-llm:2.50.0", "resources": {"limits": {"cpu": 4, "memory": "16Gi"}}}
RAYSERVICE = {
    "apiVersion": "ray.io/v1",
    "kind": "RayService",
    "metadata": {"name": "pd-llm", "namespace": "pdops"},
    "spec": {
        "serveConfigV2": "applications: []\n",
        "rayClusterConfig": {
            "rayVersion": "2.50.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [CONTAINER]}}},
            "workerGroupSpecs": [{
                "groupName": "prefill", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
                "rayStartParams": {}, "template": {"spec": {"containers": [copy.deepcopy(CONTAINER)]}},
            }],
        },
    },
}
WORKFLOWTEMPLATE = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "WorkflowTemplate",
    "metadata": {"name": "pd-release"},
    "spec": {
        "entrypoint": "main",
        "templates": [{"name": "main", "retryStrategy": {"limit": "2"},
                       "container": {"image": "alpine:3", "command": ["true"]}}],
    },
}
EVENTSOURCE = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "EventSource",
    "metadata": {"name": "pdops-webhook"},
    "spec": {"webhook": {"push": {"endpoint": "/push", "port": "12000", "method": "POST",
                                  "url": "https://events.example.com"}}},
}
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "pd-llm"},
    "spec": {"ports": [{"name": "openai", "port": 8000, "targetPort": 8000}], "selector": {"app": "pd-llm"}},
}


def check(obj: dict) -> list:
    return validate_objects([obj], SCHEMAS, "out.yaml")


def changed(obj: dict, edit) -> dict:
    obj = copy.deepcopy(obj)
    edit(obj)
    return obj


def only(findings: list):
    assert len(findings) == 1, [f.render() for f in findings]
    return findings[0]


@pytest.mark.parametrize("obj", [RAYSERVICE, WORKFLOWTEMPLATE, EVENTSOURCE, SERVICE], ids=lambda o: o["kind"])
def test_valid_objects_pass(obj):
    assert check(obj) == []


def test_misspelled_worker_group_field_is_named_with_its_path():
    worker = lambda o: o["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]  # noqa: E731
    bad = changed(RAYSERVICE, lambda o: worker(o).update(replicaz=worker(o).pop("replicas")))
    f = only(check(bad))
    assert (f.rule, f.severity, f.file) == ("schema", "error", "out.yaml")
    assert f.field == "RayService/pd-llm spec.rayClusterConfig.workerGroupSpecs[0].replicaz"
    assert "remove or fix the spelling of `replicaz`" in f.fix and "`replicas`" in f.fix


def test_wrong_type_is_caught():
    bad = changed(RAYSERVICE, lambda o: o["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replicas="two"))
    f = only(check(bad))
    assert f.field == "RayService/pd-llm spec.rayClusterConfig.workerGroupSpecs[0].replicas"
    assert "is not of type 'integer'" in f.message and f.fix == "use a value of type integer"


@pytest.mark.parametrize("value, ok", [(4, True), ("500m", True), (True, False), ([4], False)])
def test_int_or_string_quantities(value, ok):
    def edit(o):
        o["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] = {
            "limits": {"cpu": value}}
    findings = check(changed(RAYSERVICE, edit))
    if ok:
        assert findings == []
    else:
        assert only(findings).field.endswith("containers[0].resources.limits.cpu")


def test_cel_rule_fires_on_managed_by():
    f = only(check(changed(RAYSERVICE, lambda o: o["spec"].update(managedBy="bogus"))))
    assert f.field == "RayService/pd-llm spec.managedBy"
    assert f.message.startswith("the managedBy field value must be either 'ray.io/kuberay-operator'")
    assert "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']" in f.fix
    assert check(changed(RAYSERVICE, lambda o: o["spec"].update(managedBy="ray.io/kuberay-operator"))) == []


def test_metadata_name_is_required():
    f = only(check(changed(RAYSERVICE, lambda o: o["metadata"].pop("name"))))
    assert f.field == "RayService/? metadata" and "'name' is a required property" in f.message


def test_workflowtemplate_typo_fails():
    bad = changed(WORKFLOWTEMPLATE, lambda o: o["spec"].update(entrypont=o["spec"].pop("entrypoint")))
    f = only(check(bad))
    assert f.field == "WorkflowTemplate/pd-release spec.entrypont" and "`entrypoint`" in f.fix


def test_workflowtemplate_integer_retry_limit_passes():
    assert check(changed(WORKFLOWTEMPLATE, lambda o: o["spec"]["templates"][0]["retryStrategy"].update(limit=3))) == []


def test_workflowtemplate_cel_rule_two_template_types():
    bad = changed(WORKFLOWTEMPLATE, lambda o: o["spec"]["templates"][0].update(script={"image": "a", "source": "b"}))
    f = only(check(bad))
    assert f.field == "WorkflowTemplate/pd-release spec.templates"
    assert f.message == "template must have at most one template type"


def test_core_service_typo_fails():
    bad = changed(SERVICE, lambda o: o["spec"]["ports"][0].update(protocl="TCP"))
    f = only(check(bad))
    assert f.field == "Service/pd-llm spec.ports[0].protocl" and "`protocol`" in f.fix


def test_kind_without_pinned_schema_is_info():
    podmonitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "pd-llm"},
                  "spec": {"podMetricsEndpoints": [{"port": "metrics"}]}}
    f = only(check(podmonitor))
    assert (f.severity, f.rule, f.field) == ("info", "schema", "PodMonitor/pd-llm")
    assert f.message == "no pinned schema for monitoring.coreos.com/v1 PodMonitor; not validated"


def test_eventsource_typo_and_wrong_type_fail():
    typo = changed(EVENTSOURCE, lambda o: o["spec"]["webhook"]["push"].update(methd="POST"))
    assert only(check(typo)).field == "EventSource/pdops-webhook spec.webhook.push.methd"
    wrong = changed(EVENTSOURCE, lambda o: o["spec"]["webhook"]["push"].update(port=12000))
    f = only(check(wrong))
    assert f.field == "EventSource/pdops-webhook spec.webhook.push.port" and f.fix == "use a value of type string"


def test_findings_for_every_object_in_a_manifest():
    bad_service = changed(SERVICE, lambda o: o["spec"].update(typ="ClusterIP"))
    findings = validate_objects([RAYSERVICE, bad_service, EVENTSOURCE], SCHEMAS, "out.yaml")
    assert [f.field for f in findings] == ["Service/pd-llm spec.typ"]


def test_missing_schema_dir_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as err:
        validate_objects([SERVICE], tmp_path / "nope", "out.yaml")
    assert err.value.problem == "schema folder not found" and "PDOPS_SCHEMA_DIR" in err.value.fix
