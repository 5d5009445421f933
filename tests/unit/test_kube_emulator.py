"""The test cluster (tests/fakes/kube) keeps the API-server and KubeRay semantics the Kubernetes target relies
on; each test drives it through the official `kubernetes` client, as the target does."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.conftest import ROOT
from workflows.render.manifest import render

NS = "pdops-local"
APPLY = "application/apply-patch+yaml"


def _core(cluster, agent="pdops-test"):
    return client.CoreV1Api(cluster.client(agent))


def _custom(cluster, agent="pdops-test"):
    return client.CustomObjectsApi(cluster.client(agent))


def _cm(name="c", data=None, **meta):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS, **meta}, "data": data or {"a": "1"}}


def _json(response):
    return json.loads(response.data)


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_every_write_bumps_resource_version_and_a_stale_one_is_a_conflict(kube_cluster):
    core = _core(kube_cluster)
    created = _json(core.create_namespaced_config_map(NS, _cm(), _preload_content=False))
    updated = _json(core.replace_namespaced_config_map("c", NS, {**created, "data": {"a": "2"}}, _preload_content=False))
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("c", NS, {**created, "data": {"a": "3"}})
    assert stale.value.status == 409 and "the object has been modified" in _status(stale.value)["message"]
    with pytest.raises(ApiException) as precondition:
        core.delete_namespaced_config_map("c", NS, body={"preconditions": {"resourceVersion": created["metadata"]["resourceVersion"]}})
    assert precondition.value.status == 409 and "Precondition failed: ResourceVersion" in _status(precondition.value)["message"]
    core.delete_namespaced_config_map("c", NS, body={"preconditions": {"resourceVersion": updated["metadata"]["resourceVersion"]}})
    assert kube_cluster.objects("configmaps", NS) == {}


def test_configmap_values_are_limited_to_one_mebibyte(kube_cluster):
    core = _core(kube_cluster)
    core.create_namespaced_config_map(NS, _cm(data={"a": "x" * (1024 * 1024)}), _preload_content=False)
    with pytest.raises(ApiException) as big:
        core.create_namespaced_config_map(NS, _cm("d", data={"a": "x" * (1024 * 1024), "b": "y"}))
    assert big.value.status == 422 and "Too long: may not be more than 1048576 bytes" in _status(big.value)["message"]


def test_server_side_apply_creates_prunes_and_reports_conflicts(kube_cluster):
    core = _core(kube_cluster)
    first = _json(core.patch_namespaced_config_map("c", NS, _cm(data={"a": "1", "b": "2"}), field_manager="pdops",
                                                    _content_type=APPLY, _preload_content=False))
    assert first["metadata"]["managedFields"][0]["manager"] == "pdops"
    again = _json(core.patch_namespaced_config_map("c", NS, _cm(data={"a": "1"}), field_manager="pdops",
                                                    _content_type=APPLY, _preload_content=False))
    assert again["data"] == {"a": "1"}  # b was applied by pdops before and left out now: removed
    core.patch_namespaced_config_map("c", NS, {"data": {"a": "by-hand"}}, field_manager="kubectl-edit", _preload_content=False)
    with pytest.raises(ApiException) as clash:
        core.patch_namespaced_config_map("c", NS, _cm(data={"a": "1"}), field_manager="pdops", _content_type=APPLY)
    assert clash.value.status == 409 and 'conflict with "kubectl-edit"' in _status(clash.value)["message"]
    forced = _json(core.patch_namespaced_config_map("c", NS, _cm(data={"a": "1"}), field_manager="pdops", force=True,
                                                     _content_type=APPLY, _preload_content=False))
    assert forced["data"] == {"a": "1"}


def test_dry_run_validates_and_stores_nothing(kube_cluster):
    core = _core(kube_cluster)
    core.create_namespaced_config_map(NS, _cm(), dry_run="All", _preload_content=False)
    assert kube_cluster.objects("configmaps", NS) == {}
    with pytest.raises(ApiException) as big:
        core.create_namespaced_config_map(NS, _cm(data={"a": "x" * (1024 * 1024 + 1)}), dry_run="All")
    assert big.value.status == 422


def test_label_selectors_filter_lists(kube_cluster):
    core = _core(kube_cluster)
    for name, colour in (("a", "blue"), ("b", "green"), ("c", None)):
        core.create_namespaced_config_map(NS, _cm(name, labels={"colour": colour} if colour else {}), _preload_content=False)
    names = lambda sel: sorted(o["metadata"]["name"] for o in _json(core.list_namespaced_config_map(NS, label_selector=sel, _preload_content=False))["items"])
    assert names("colour=blue") == ["a"]
    assert names("colour in (blue,green)") == ["a", "b"]
    assert names("!colour") == ["c"]
    assert names("colour!=blue") == ["b", "c"]


def _rayservice(name="pd-llm-blue", colour="blue"):
    rs = copy.deepcopy(next(o for o in render(ROOT / "overlays" / "local", validate_serve_config=False).objects if o["kind"] == "RayService"))
    rs["metadata"].update(name=name, namespace=NS)
    rs["metadata"]["labels"]["pdops.dev/colour"] = colour
    return rs


def _wait(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def _ready(cluster, name="pd-llm-blue"):
    rs = cluster.objects("rayservices", NS).get(name) or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (rs.get("status") or {}).get("conditions") or [])


def test_kuberay_labels_pods_serves_through_its_services_and_exports_engine_metrics_on_workers_only(kube_cluster):
    _custom(kube_cluster).patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "pd-llm-blue", _rayservice(),
                                                         field_manager="pdops", force=True, _content_type=APPLY)
    _wait(lambda: _ready(kube_cluster))
    pods = kube_cluster.objects("pods", NS)
    by_type = {(p["metadata"]["labels"]["ray.io/node-type"], p["metadata"]["labels"].get("pdops.dev/phase")): p for p in pods.values()}
    assert set(by_type) == {("head", None), ("worker", "prefill"), ("worker", "decode")}
    assert {p["metadata"]["labels"]["ray.io/serve"] for p in pods.values()} == {"true"}
    services = kube_cluster.objects("services", NS)
    assert services["pd-llm-blue-serve-svc"]["spec"]["selector"]["ray.io/serve"] == "true"
    assert services["pd-llm-blue-head-svc"]["spec"]["selector"]["ray.io/node-type"] == "head"
    models = urllib.request.urlopen(kube_cluster.resolve("http://pd-llm-blue-serve-svc.pdops-local.svc.cluster.local:8000/v1/models"), timeout=5)
    assert json.loads(models.read())["data"][0]["id"] == "pdops-tiny"
    metrics = {k: urllib.request.urlopen(f"http://{p['status']['podIP']}:8080/metrics", timeout=5).read().decode() for k, p in by_type.items()}
    assert "ray_vllm_time_to_first_token_seconds_count" not in metrics[("head", None)]
    assert all("ray_vllm_time_to_first_token_seconds_count" in metrics[k] for k in by_type if k[0] == "worker")
    head_metrics = urllib.request.urlopen(kube_cluster.resolve("http://pd-llm-blue-head-svc.pdops-local.svc.cluster.local:8080/metrics"), timeout=5)
    assert "ray_vllm_" not in head_metrics.read().decode()


def test_head_pod_is_not_serving_until_its_proxy_is_healthy(kube_cluster):
    kube_cluster.kuberay.behaviour["blue"] = "head_unhealthy"
    _custom(kube_cluster).patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "pd-llm-blue", _rayservice(),
                                                         field_manager="pdops", force=True, _content_type=APPLY)
    _wait(lambda: _ready(kube_cluster))
    head = next(p for p in kube_cluster.objects("pods", NS).values() if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    assert head["metadata"]["labels"]["ray.io/serve"] == "false"


def test_deleted_rayservice_lingers_until_kuberay_removed_its_clusters(kube_cluster):
    custom = _custom(kube_cluster)
    custom.patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "pd-llm-blue", _rayservice(),
                                          field_manager="pdops", force=True, _content_type=APPLY)
    _wait(lambda: _ready(kube_cluster))
    custom.delete_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "pd-llm-blue")
    terminating = kube_cluster.objects("rayservices", NS)["pd-llm-blue"]
    assert terminating["metadata"]["deletionTimestamp"] and terminating["metadata"]["finalizers"] == ["ray.io/rayservice-finalizer"]
    _wait(lambda: not kube_cluster.objects("rayservices", NS))
    assert kube_cluster.objects("pods", NS) == {} and kube_cluster.objects("rayclusters", NS) == {}


def test_validation_failure_is_a_condition_with_kuberays_message(kube_cluster):
    kube_cluster.kuberay.behaviour["blue"] = "invalid"
    _custom(kube_cluster).patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "pd-llm-blue", _rayservice(),
                                                         field_manager="pdops", force=True, _content_type=APPLY)
    ready = _wait(lambda: next((c for c in (kube_cluster.objects("rayservices", NS)["pd-llm-blue"].get("status") or {}).get("conditions") or []
                                if c["type"] == "Ready" and c["reason"] == "ValidationFailed"), None))
    assert "image is not allowed" in ready["message"] and kube_cluster.objects("pods", NS) == {}


def test_a_subprocess_reaches_the_cluster_through_the_kubeconfig(kube_cluster):
    code = ("from kubernetes import client, config; config.load_kube_config(); "
            "print(len(client.CoreV1Api().list_namespace().items))")
    out = subprocess.run([sys.executable, "-c", code], env={"KUBECONFIG": str(kube_cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 6
