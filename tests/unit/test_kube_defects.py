"""Issue 13's defects of the Kubernetes target, each shown on the test cluster (tests/fakes/kube): every test
here failed on the target before the fix (workflows/targets/kubernetes.py at ac0a2cf) and passes after."""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
import yaml
from kubernetes import client

from tests.kube_support import LOCAL_NS, Lines, eventually, history, live, record, release, target
from validation import profiles
from validation.bench import BenchConfig, run_bench
from workflows.targets.base import TargetError


def _resolve(cluster, url: str) -> str:
    return ",".join(cluster.resolve(part) for part in url.split(","))


# 1. Validation's metrics come from the engines: every worker pod of the colour, split per phase.
def test_candidate_metrics_come_from_every_worker_pod_per_phase_with_kv_transfer(cluster, manifests):
    t = target(cluster)
    release(t, record(manifests, variant="a"))
    t.apply(record(manifests, variant="b"), Lines())
    endpoint = t.wait_ready(30, Lines())
    workers = {p["status"]["podIP"] for p in live(cluster, "pods").values()
               if p["metadata"]["labels"]["pdops.dev/colour"] == "green" and p["metadata"]["labels"]["ray.io/node-type"] == "worker"}
    bench = run_bench(BenchConfig(cluster.resolve(endpoint.base_url), "pdops-tiny", profiles.get("balanced"), concurrency=2, requests=6,
                                  metrics_url=_resolve(cluster, endpoint.metrics_url), metrics_lag_s=endpoint.metrics_lag_s))
    server = bench.server
    assert bench.requests_ok == 6 and server is not None and server.error is None
    assert server.kv is not None and server.kv.kv_transfer_observed and server.requests_seen == 6
    assert {phase: h["time_to_first_token_seconds"].count for phase, h in (server.phases or {}).items()} == \
        {"prefill": 6, "decode": 6}
    assert {u.split("//")[1].split(":")[0] for u in endpoint.metrics_url.split(",")} == workers


# 3. PodDisruptionBudgets must allow a drain of healthy KubeRay pods.
def test_each_colours_pdbs_allow_one_disruption_of_healthy_kuberay_pods(cluster, manifests):
    release(target(cluster), record(manifests))
    pdbs = eventually(lambda: {n: p for n, p in live(cluster, "poddisruptionbudgets").items()
                               if (p.get("status") or {}).get("currentHealthy") == 1} or None)
    assert set(pdbs) == {"pd-llm-prefill-blue", "pd-llm-decode-blue"}
    for pdb in pdbs.values():
        assert pdb["spec"]["minAvailable"] == 0 and "maxUnavailable" not in pdb["spec"]
        assert pdb["status"]["disruptionsAllowed"] == 1, pdb["status"]


def test_the_rendered_pdbs_are_what_the_target_applies(cluster, manifests):
    """`pdops render` output equals what the target applies (issue 22 item 7): a user who applies the render
    with kubectl, Argo CD or Flux gets the integer minAvailable form, never maxUnavailable (workflows/render/pdb.py)."""
    rendered = {p["metadata"]["name"]: p for p in manifests["local"].objects if p["kind"] == "PodDisruptionBudget"}
    assert rendered and all("maxUnavailable" not in p["spec"] for p in rendered.values())
    release(target(cluster), record(manifests))
    applied = live(cluster, "poddisruptionbudgets")
    assert set(applied) == {f"{name}-blue" for name in rendered}
    for name, pdb in rendered.items():
        spec = dict(applied[f"{name}-blue"]["spec"])
        match = dict(spec.pop("selector")["matchLabels"])
        assert match.pop("pdops.dev/colour") == "blue"   # the only change: one PDB set per colour
        assert match == pdb["spec"]["selector"]["matchLabels"]
        assert spec == {k: v for k, v in pdb["spec"].items() if k != "selector"}


def test_a_pdb_with_a_percentage_is_refused_at_render_naming_the_kustomization(tmp_path):
    import shutil

    from tests.conftest import ROOT
    from workflows.errors import InputError
    from workflows.render.manifest import render

    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    base = tmp_path / "kustomize" / "base" / "pdb.yaml"
    base.write_text(base.read_text().replace("maxUnavailable: 1", "maxUnavailable: 50%", 1))
    with pytest.raises(InputError) as bad:
        render(tmp_path / "overlays" / "local", validate_serve_config=False)
    assert "kustomization.yaml" in str(bad.value.file) and "PodDisruptionBudget/" in bad.value.field
    assert "scale subresource" in bad.value.problem


# 4. History stays under the 1 MiB ConfigMap limit, and rollback keeps working at it.
def test_history_stays_under_a_mebibyte_with_huge_failure_reasons(cluster, manifests):
    t = target(cluster)
    release(t, record(manifests, variant="a"))
    cluster.kuberay.behaviour["green"] = "fail"
    traceback = "Traceback (most recent call last):\n" + "  File \"vllm/engine.py\", line 1, in run\n" * 6000  # ~300 KiB
    for i in range(5):
        t.apply(record(manifests, variant=f"f{i}"), Lines())
        with pytest.raises(TargetError):
            t.wait_ready(30, Lines())
        t.rollback([f"validation failed: {traceback}"], None, Lines())
        eventually(lambda: "pd-llm-green" not in cluster.objects("rayservices", LOCAL_NS))
    cm = cluster.objects("configmaps", LOCAL_NS)["pdops-history-pd-llm"]
    assert sum(len(v.encode()) for v in cm["data"].values()) < 1024 * 1024
    assert [r["verdict"] for r in history(cluster)] == ["promote"] + ["rollback"] * 5
    assert "more characters in the report" in history(cluster)[-1]["reasons"][0]
    assert t.status().stable.state == "ready" and t.status().last_good.revision.startswith("a")


# 5. A stable RayService that is still terminating is waited for, then redeployed; never applied into.
def test_rollback_redeploys_a_stable_that_is_still_terminating(cluster, manifests):
    release(target(cluster), record(manifests))
    cluster.kuberay.terminate_ticks = 40  # KubeRay needs ~2 s to remove its clusters
    client.CustomObjectsApi(cluster.client()).delete_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices", "pd-llm-blue")
    progress = Lines()
    assert "redeployed from history" in target(cluster).rollback(["stable lost"], None, progress)
    assert any("waiting for RayService pd-llm-blue to finish terminating" in line for line in progress)
    rs = cluster.objects("rayservices", LOCAL_NS)["pd-llm-blue"]
    assert not rs["metadata"].get("deletionTimestamp") and target(cluster).status().stable.state == "ready"


# 6. KubeRay's terminal conditions end the wait at once, with KubeRay's message.
def test_validation_failed_fails_at_once_with_kuberays_message(cluster, manifests):
    t = target(cluster)
    cluster.kuberay.behaviour["blue"] = "invalid"
    t.apply(record(manifests), Lines())
    started = time.monotonic()
    with pytest.raises(TargetError) as failed:
        t.wait_ready(20, Lines())
    assert time.monotonic() - started < 10
    assert "ValidationFailed" in failed.value.problem and "image is not allowed" in failed.value.problem
    assert any("InvalidRayServiceSpec" in d for d in failed.value.details)


def test_initializing_timeout_fails_at_once(cluster, manifests):
    def timeout(objects):
        next(o for o in objects if o["kind"] == "RayService")["metadata"]["annotations"]["ray.io/initializing-timeout"] = "0.3s"
    cluster.kuberay.behaviour["blue"] = "stuck"
    t = target(cluster)
    t.apply(record(manifests, edit=timeout), Lines())
    started = time.monotonic()
    with pytest.raises(TargetError, match="InitializingTimeout"):
        t.wait_ready(20, Lines())
    assert time.monotonic() - started < 10


# 7. The stable Service selects every serving pod of the colour, so a failed head health check leaves endpoints.
def test_stable_service_keeps_serving_when_the_heads_proxy_is_unhealthy(cluster, manifests):
    cluster.kuberay.behaviour["blue"] = "head_unhealthy"
    release(target(cluster), record(manifests))
    selector = cluster.objects("services", LOCAL_NS)["pd-llm"]["spec"]["selector"]
    selected = [p for p in live(cluster, "pods").values() if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
    assert {p["metadata"]["labels"]["ray.io/node-type"] for p in selected} == {"worker"}
    def models():  # a new Service takes a moment to be programmed (kube-proxy here too)
        try:
            return urllib.request.urlopen(cluster.resolve("http://pd-llm.pdops-local.svc.cluster.local:8000/v1/models"), timeout=5).read()
        except OSError:
            return None
    assert json.loads(eventually(models, 10))["data"][0]["id"] == "pdops-tiny"


# 8. Promote drains the old colour: a stream in flight on it finishes.
def test_promote_lets_a_stream_on_the_old_colour_finish(cluster, manifests):
    cluster.kuberay.engine = {"inter_token_delay": 0.15, "tokens": 12}  # a 1.8 s stream
    t = target(cluster, drain_grace_s=3.0)
    release(t, record(manifests, variant="a"))
    t.apply(record(manifests, variant="b"), Lines())
    t.wait_ready(30, Lines())
    chunks: list[bytes] = []

    def stream() -> None:
        request = urllib.request.Request(cluster.resolve("http://pd-llm.pdops-local.svc.cluster.local:8000/v1/chat/completions"),
                                         json.dumps({"model": "pdops-tiny", "stream": True, "max_tokens": 12,
                                                     "messages": [{"role": "user", "content": "hello"}]}).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                chunks.extend(iter(lambda: response.read(64), b""))
        except Exception as exc:  # noqa: BLE001 - a cut stream is what the test looks for
            chunks.append(repr(exc).encode())
    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(0.3)  # the stream is on blue
    progress = Lines()
    t.promote(["gate: promote"], None, progress)
    reader.join(20)
    assert b"data: [DONE]" in b"".join(chunks), b"".join(chunks)[-300:]
    assert any("routes to green only" in line for line in progress)
    assert set(live(cluster, "rayservices")) == {"pd-llm-green"}


# 10. No second RayCluster inside a colour when its rayClusterConfig changes (upgradeStrategy None).
def test_a_changed_cluster_config_builds_no_second_cluster_in_a_colour(cluster, manifests):
    rec = record(manifests)
    rendered = next(o for o in yaml.safe_load_all(rec.manifest) if o and o["kind"] == "RayService")
    assert rendered["spec"]["upgradeStrategy"] == {"type": "None"} and "serviceUnhealthySecondThreshold" not in rendered["spec"]
    release(target(cluster), rec)
    custom = client.CustomObjectsApi(cluster.client("someone"))
    custom.patch_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices", "pd-llm-blue",
                                          {"spec": {"rayClusterConfig": {"rayVersion": "2.61.0"}}})
    time.sleep(0.5)
    assert len(cluster.objects("rayclusters", LOCAL_NS)) == 1
