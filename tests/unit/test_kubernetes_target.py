"""The Kubernetes target on the test cluster (tests/fakes/kube: an API server with resourceVersion,
finalizers, server-side apply, label selectors, dryRun and size limits, and a fake KubeRay v1.7),
driven with the real `kubernetes` client. Assertions read the stored objects, not the target's
return values alone."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.conftest import SCHEMAS
from tests.kube_support import (
    DEV_NS,
    LOCAL_NS,
    Lines,
    eventually as _eventually,
    gpu_nodes,
    history as _history,
    live,
    record as _record,
    release as _release,
    target as _target,
)
from workflows.checks.schema import validate_objects
from workflows.targets.base import TargetError


@pytest.fixture
def kuberay(cluster):
    return cluster.kuberay


def _desired(snapshot: dict) -> dict:
    """What the target writes: objects without the status, and nothing KubeRay owns."""
    return {k: {f: v for f, v in o.items() if f not in ("status",)} | {"metadata": {m: v for m, v in o["metadata"].items() if m not in ("resourceVersion", "managedFields", "finalizers", "generation")}}
            for k, o in snapshot.items() if k[0] not in ("pods", "events", "rayclusters", "services", "endpointslices") or k[1] == "pd-llm"}


def _selects(service: dict, pod: dict) -> bool:
    return all(pod["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())


def test_apply_ready_promote_switches_the_service_to_the_candidate_colour(cluster, kuberay, manifests):
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    first = _release(target, a)
    assert first.colour == "blue"
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"

    progress = Lines()
    candidate = target.apply(b, progress)
    assert candidate.colour == "green"
    rayservices = cluster.objects("rayservices")
    assert set(rayservices) == {"pd-llm-blue", "pd-llm-green"}
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"  # not before promote
    assert target.status().candidate.release.digest == b.digest

    endpoint = target.wait_ready(30, progress)
    assert endpoint.base_url == "http://pd-llm-green-serve-svc.pdops-local.svc.cluster.local:8000/v1"
    assert any(re.fullmatch(r"\[rollout\] pd-llm-green: (DEPLOYING|waiting for KubeRay) \(\d+s\)", line) for line in progress)
    assert progress[-1].startswith("[rollout] pd-llm-green: RUNNING (")
    target.promote(["gate: promote"], "reports/b.md", progress)

    service = cluster.objects("services")["pd-llm"]
    pods = cluster.objects("pods")
    assert {p["metadata"]["labels"]["pdops.dev/colour"] for p in pods.values() if _selects(service, p)} == {"green"}
    assert set(live(cluster, "rayservices")) == {"pd-llm-green"}  # the old stable's GPUs are freed
    assert set(live(cluster, "poddisruptionbudgets")) == {"pd-llm-prefill-green", "pd-llm-decode-green"}
    assert cluster.objects("poddisruptionbudgets")["pd-llm-decode-green"]["spec"]["selector"]["matchLabels"]["pdops.dev/colour"] == "green"
    history = _history(cluster)
    assert [(r["revision"][0], r["verdict"], r["colour"]) for r in history] == [("a", "promote", "blue"), ("b", "promote", "green")]
    assert history[-1]["manifest"] == b.manifest and history[-1]["report"] == "reports/b.md"
    status = target.status()
    assert (status.stable.state, status.stable.release.digest, status.candidate.state) == ("ready", b.digest, "absent")
    assert target.endpoint("stable").base_url == "http://pd-llm.pdops-local.svc.cluster.local:8000/v1"


def test_failed_candidate_then_rollback_keeps_stable_and_records_the_verdict(cluster, kuberay, manifests):
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    blue_before, service_before = cluster.objects("rayservices")["pd-llm-blue"], cluster.objects("services")["pd-llm"]
    kuberay.behaviour["green"] = "fail"
    target.apply(b, Lines())
    with pytest.raises(TargetError) as failed:
        target.wait_ready(30, Lines())
    assert "DEPLOY_FAILED" in failed.value.problem and "CUDA out of memory" in failed.value.problem

    done = target.rollback(["deploy failed"], None, Lines())
    assert "dropped candidate" in done and "stable" in done
    assert set(live(cluster, "rayservices")) == {"pd-llm-blue"}
    assert cluster.objects("rayservices")["pd-llm-blue"] == blue_before
    assert cluster.objects("services")["pd-llm"] == service_before
    history = _history(cluster)
    assert [(r["revision"][0], r["verdict"]) for r in history] == [("a", "promote"), ("b", "rollback")]
    assert "deploy failed" in history[-1]["reasons"] and any("DEPLOY_FAILED" in r for r in history[-1]["reasons"])
    assert target.status().candidate.state == "absent"


def test_timeout_names_unschedulable_pods_and_events(cluster, kuberay, manifests):
    target = _target(cluster)
    kuberay.behaviour["blue"] = "stuck"
    target.apply(_record(manifests), Lines())
    # A pod is Pending from its creation, before the emulated scheduler (kuberay.py _bind) has called it
    # Unschedulable and written the FailedScheduling event: wait for the scheduler's verdict, or the diagnosis
    # can be taken between the two (CI run of 2026-12-07: the head pod was Pending with no condition yet).
    stuck = _eventually(lambda: next((n for n, p in cluster.objects("pods").items()
                                      if any(c.get("reason") == "Unschedulable"
                                             for c in p["status"].get("conditions") or [])), None))
    progress = Lines()
    started = time.monotonic()
    with pytest.raises(TargetError) as timeout:
        target.wait_ready(0.5, progress)
    assert time.monotonic() - started < 10
    assert "not ready after" in timeout.value.problem
    text = timeout.value.render()
    assert f"pod {stuck}: Pending, Unschedulable: 0/2 nodes are available" in text
    assert f"event Warning FailedScheduling Pod/{stuck}" in text
    assert any(line.startswith("[rollout] pd-llm-blue: DEPLOYING (") for line in progress)
    target.rollback(["timeout"], None, Lines())
    assert live(cluster, "rayservices") == {}
    assert [r["verdict"] for r in _history(cluster)] == ["rollback"]


def test_rollback_redeploys_a_deleted_stable_from_the_history_configmap_alone(cluster, kuberay, manifests):
    a = _record(manifests)
    _release(_target(cluster), a)
    client.CustomObjectsApi(cluster.client()).delete_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices", "pd-llm-blue")
    _eventually(lambda: cluster.objects("rayservices") == {})

    fresh = _target(cluster)  # nothing in memory: only the cluster
    assert fresh.status().stable.state == "absent"
    done = fresh.rollback(["stable lost"], None, Lines())
    assert "redeployed from history" in done
    restored = cluster.objects("rayservices")["pd-llm-blue"]
    rendered = next(o for o in yaml.safe_load_all(a.manifest) if o and o["kind"] == "RayService")
    assert restored["spec"]["serveConfigV2"] == rendered["spec"]["serveConfigV2"]
    assert restored["metadata"]["annotations"]["pdops.dev/digest"] == a.digest
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"
    assert fresh.status().stable.state == "ready"


def test_rerun_of_the_same_revision_writes_nothing(cluster, kuberay, manifests):
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    before, writes = cluster.snapshot(), len(cluster.writes())
    progress = Lines()
    stable = _target(cluster).apply(a, progress)
    assert (stable.verdict, stable.colour) == ("promote", "blue")  # the caller decides what to do with it
    assert "already stable in blue" in progress[-1]
    assert len(cluster.writes()) == writes

    target.apply(b, Lines())
    before, writes = cluster.snapshot(), len(cluster.writes())
    again = _target(cluster).apply(b, progress)
    assert (again.digest, again.colour, again.verdict) == (b.digest, "green", "pending")
    assert "already the pending candidate" in progress[-1]
    assert len(cluster.writes()) == writes
    assert _desired(cluster.snapshot()) == _desired(before)


def test_a_different_pending_candidate_is_refused(cluster, kuberay, manifests):
    target = _target(cluster)
    _release(target, _record(manifests, variant="a"))
    target.apply(_record(manifests, variant="b"), Lines())
    writes = len(cluster.writes())
    with pytest.raises(TargetError) as refused:
        _target(cluster).apply(_record(manifests, variant="c"), Lines())
    assert "pdops rollback --if-candidate-pending" in refused.value.render()
    assert len(cluster.writes()) == writes
    assert cluster.objects("rayservices")["pd-llm-green"]["metadata"]["annotations"]["test/variant"] == "b"


def test_dry_run_leaves_the_cluster_unchanged(cluster, kuberay, manifests):
    _release(_target(cluster), _record(manifests, variant="a"))
    time.sleep(0.1)  # let the simulated KubeRay settle the stable status
    before, earlier = cluster.snapshot(), len(cluster.writes())

    dry, progress = _target(cluster, dry_run=True), Lines()
    assert dry.apply(_record(manifests, variant="b"), progress).colour == "green"
    dry.wait_ready(1, progress)
    dry.promote(["dry"], None, progress)
    assert any("(dry run)" in line for line in progress)
    writes = cluster.writes()[earlier:]
    assert writes and all(r.params.get("dryRun") == "All" for r in writes)
    assert _desired(cluster.snapshot()) == _desired(before)


def test_crash_between_apply_and_promote_is_cleaned_up_by_a_new_target(cluster, kuberay, manifests):
    _release(_target(cluster), _record(manifests, variant="a"))
    crashed = _target(cluster)
    crashed.apply(_record(manifests, variant="b"), Lines())
    del crashed  # the process died here: no promote, no rollback

    fresh = _target(cluster)
    pending = fresh.status().candidate
    assert (pending.release.revision[0], pending.release.colour) == ("b", "green")
    fresh.rollback(["onExit: candidate left half way"], None, Lines())
    assert set(live(cluster, "rayservices")) == {"pd-llm-blue"}
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"
    assert [(r["revision"][0], r["verdict"]) for r in _history(cluster)] == [("a", "promote"), ("b", "rollback")]


def test_rollback_to_previous_restores_the_release_before_a_regressed_stable(cluster, kuberay, manifests):
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    _release(target, b)
    assert set(live(cluster, "rayservices")) == {"pd-llm-green"}

    done = _target(cluster).rollback(["canary: TTFT p90 regressed"], "reports/canary.md", Lines(), to_previous=True)
    assert "marked regressed" in done
    rayservices = live(cluster, "rayservices")
    assert set(rayservices) == {"pd-llm-blue"}
    assert rayservices["pd-llm-blue"]["metadata"]["annotations"]["pdops.dev/digest"] == a.digest
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"
    history = _history(cluster)
    assert [(r["revision"][0], r["verdict"]) for r in history] == [("a", "promote"), ("b", "regressed"), ("a", "promote")]
    assert target.status().last_good.colour == "blue"


def test_every_object_the_target_sends_validates_against_the_pinned_schemas(cluster, manifests):
    for n in gpu_nodes(1):
        cluster.add_node(n)
    target = _target(cluster, DEV_NS, capacity_check=False)
    if True:
        with target.session():
            _release(target, _record(manifests, "dev"))
            lease = list(cluster.objects("leases").values())
    sent = lease + [o for plural in ("rayservices", "services", "configmaps", "poddisruptionbudgets", "serviceaccounts")
                    for o in cluster.objects(plural).values()]
    assert {o["kind"] for o in sent} == {"RayService", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "Lease"}
    assert "status" in cluster.objects("rayservices")["pd-llm-blue"]  # the simulated KubeRay's status is checked too
    findings = validate_objects(sent, Path(SCHEMAS), "emulator")
    assert [f for f in findings if f.severity == "error"] == []


def test_leftovers_of_a_run_that_died_after_promote_are_removed(cluster, kuberay, manifests):
    target = _target(cluster)
    _release(target, _record(manifests, variant="a"))
    old_blue = cluster.objects("rayservices")["pd-llm-blue"]
    _release(target, _record(manifests, variant="b"))
    custom = client.CustomObjectsApi(cluster.client())
    def died_before_retiring_blue() -> None:
        _eventually(lambda: "pd-llm-blue" not in cluster.objects("rayservices"))
        custom.create_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices",
                                               {k: v for k, v in old_blue.items() if k != "status"})

    died_before_retiring_blue()
    client.CoreV1Api(cluster.client()).patch_namespaced_service(  # ... and before switching the Service
        "pd-llm", LOCAL_NS, {"spec": {"selector": {"pdops.dev/colour": "blue"}}}, _preload_content=False)
    stable = _target(cluster).status().stable
    assert stable.state == "failed" and "Service pd-llm selects blue" in stable.detail
    assert "stable pd-llm@bbbbbbbbbbbb" in _target(cluster).rollback(["converge"], None, Lines())
    assert set(live(cluster, "rayservices")) == {"pd-llm-green"}
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"

    died_before_retiring_blue()
    progress = Lines()
    _target(cluster).apply(_record(manifests, variant="c"), progress)
    assert any("removing leftover RayService pd-llm-blue" in line for line in progress)
    assert cluster.objects("rayservices")["pd-llm-blue"]["metadata"]["annotations"]["test/variant"] == "c"
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"


def test_api_server_error_during_the_service_switch_keeps_users_on_the_old_stable(cluster, kuberay, manifests):
    """Emulated: the API server answers 500 to the promote's Service write (an etcd timeout). Users move
    before anything is recorded (slots.py), so nothing changed: the candidate is still pending, and the
    retry of promote (Argo retries exit 75) completes it (issue 22 item 1: it used to say "no candidate
    is pending" because the history already named it stable)."""
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    target.apply(b, Lines())
    target.wait_ready(30, Lines())
    cluster.faults.failing = {"services": 1}
    with pytest.raises(TargetError, match="refused to apply Service/pd-llm in pdops-local: 500") as failed:
        target.promote(["gate: promote"], "reports/b.md", Lines())
    assert failed.value.transient
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"  # users on a
    assert set(live(cluster, "rayservices")) == {"pd-llm-blue", "pd-llm-green"}                 # nothing removed
    status = _target(cluster).status()
    assert (status.stable.release.digest, status.stable.state) == (a.digest, "ready")
    assert status.candidate.release.digest == b.digest

    _target(cluster).promote(["gate: promote"], "reports/b.md", Lines())          # the step's retry
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"
    assert set(live(cluster, "rayservices")) == {"pd-llm-green"}
    assert [(r["revision"][0], r["verdict"]) for r in _history(cluster)] == [("a", "promote"), ("b", "promote")]
    assert _target(cluster).status().stable.state == "ready"
