"""The Kubernetes target against kmock's Kubernetes API emulator on 127.0.0.1, with the real client.

What the emulator (kmock 0.8 `KubernetesEmulator`) does: stores objects in memory per
(resource, namespace, name); create (POST; 409 when it exists), get, list, delete, PATCH and
PATCH of the `status` subresource (both as a recursive dict merge of the body, lists replaced,
None deletes a key), watch streams (unused: the target polls RayService status). Assertions below
read those stored objects (and the recorded requests), not the target's return values alone.

What it does NOT do, and how the tests live with it:
- no server-side apply: an apply PATCH merges into an existing object like any patch and answers
  404 for a missing one, where a real API server would create it. The target falls back to create
  on that 404 (a real server never takes that path); removed fields are not pruned by the merge.
- no dryRun: `Cluster` adds it (a request with dryRun=All is answered with its body and nothing is
  stored), which is what a real API server does after validation and admission.
- no label or field selectors (lists return everything): the target filters pods and events itself.
- no resourceVersion, generation/observedGeneration, owner references or garbage collection: the
  simulated KubeRay below deletes a RayService's pods itself; readiness ignores generations when
  absent.
- no scheduler or kubelet: pods, their states and Events are written by the simulated KubeRay.

`FakeKubeRay` is a small stand-in for the KubeRay v1.7 operator: for every RayService it creates a
head pod labelled as KubeRay labels pods (template labels + ray.io/cluster, ray.io/node-type,
ray.io/serve), then moves the status (field names from the pinned CRD; a test validates them) to
RUNNING, DEPLOY_FAILED, or leaves it DEPLOYING with an unschedulable worker pod, per colour.
"""
from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import aiohttp.web
import kmock
import pytest
import yaml
from kubernetes import client

from tests.conftest import ROOT, SCHEMAS
from workflows.checks.schema import validate_objects
from workflows.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord, TargetError
from workflows.targets.kubernetes import KubernetesTarget

LOCAL_NS, DEV_NS = "pdops-local", "llm-dev"
WRITES = ("POST", "PATCH", "PUT", "DELETE")
KUBERAY_AGENT = "fake-kuberay"


class _Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus dryRun=All, forbidden resources (403) and injected server errors (500 to
    the next N writes of a resource), as an API server answers them."""

    forbidden: set[str] = set()
    failing: dict[str, int] = {}

    async def _handle(self, request):  # type: ignore[override]
        if request.resource is not None and request.resource.plural in self.forbidden:
            return await self._render_error(kmock.KubernetesError(403, "Forbidden", f"{request.resource.plural} is forbidden"))
        plural = request.resource.plural if request.resource is not None else None
        if self.failing.get(plural) and request.method in WRITES:
            self.failing[plural] -= 1
            return await self._render_error(kmock.KubernetesError(500, "InternalError", "etcdserver: request timed out"))
        if request.params.get("dryRun") == "All" and request.action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            return aiohttp.web.json_response(request.data or {})
        return await super()._handle(request)


class Cluster:
    """The emulator served from its own thread and event loop (the kubernetes client is synchronous)."""

    def __init__(self) -> None:
        started = threading.Event()

        async def serve() -> None:
            self._stop = asyncio.Event()
            async with _Emulator() as emulator, kmock.Server(emulator) as server:
                self.emulator, self.url, self.loop = emulator, str(server.url).rstrip("/"), asyncio.get_running_loop()
                self.emulator.forbidden, self.emulator.failing = set(), {}
                started.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        self._thread.start()
        assert started.wait(10), "emulator did not start"

    def client(self, agent: str = "pdops-test") -> client.ApiClient:
        configuration = client.Configuration()
        configuration.host = self.url
        api = client.ApiClient(configuration)
        api.user_agent = agent
        return api

    def _in_loop(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def objects(self, plural: str) -> dict[str, dict]:
        """Stored, not deleted objects of a resource (any group), by name."""
        return self._in_loop(lambda: {name: json.loads(json.dumps(obj.raw)) for (res, _, name), obj in self.emulator.objects.items()
                                      if res.plural == plural and not obj.deleted})

    def snapshot(self) -> dict:
        return self._in_loop(lambda: {(res.plural, name): json.loads(json.dumps(obj.raw))
                                      for (res, _, name), obj in self.emulator.objects.items() if not obj.deleted})

    def writes(self, agent: str = "pdops-test") -> list:
        """Write requests sent by the target (the simulated KubeRay's are left out)."""
        return self._in_loop(lambda: [r for r in self.emulator if r.method in WRITES and r.headers.get("User-Agent") == agent])

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class FakeKubeRay:
    """Moves RayService status like KubeRay v1.7; `behaviour[colour]` is ok | fail | stuck."""

    TICKS_TO_READY = 3

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.ns, self.behaviour, self.ticks, self.error = namespace, {}, {}, None
        api = cluster.client(KUBERAY_AGENT)
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # surfaced by close(), so a broken fake fails the test, not a timeout
                self.error = exc
                return
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        assert self.error is None, f"simulated KubeRay failed: {self.error!r}"

    def _pods(self) -> dict[str, dict]:
        try:
            return {p["metadata"]["name"]: p for p in json.loads(self.core.list_namespaced_pod(self.ns, _preload_content=False).data)["items"]}
        except client.ApiException:
            return {}

    def tick(self) -> None:
        try:
            items = self.custom.list_namespaced_custom_object("ray.io", "v1", self.ns, "rayservices")["items"]
        except client.ApiException:  # 404 until the emulator has seen a RayService
            items = []
        names = {rs["metadata"]["name"] for rs in items}
        for pod_name, pod in self._pods().items():  # owner-reference garbage collection
            if pod["metadata"]["labels"].get("test/rayservice") not in names:
                try:
                    self.core.delete_namespaced_pod(pod_name, self.ns, _preload_content=False)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
        for rs in items:
            try:
                self._reconcile(rs)
            except client.ApiException as exc:
                if exc.status != 404:  # deleted since the list, as a real controller sees it too
                    raise

    def _reconcile(self, rs: dict) -> None:
        name = rs["metadata"]["name"]
        colour = rs["metadata"]["labels"]["pdops.dev/colour"]
        behaviour = self.behaviour.get(colour, "ok")
        tick = self.ticks[name] = 1 if "status" not in rs else self.ticks.get(name, 0) + 1  # new or recreated
        cluster_name = f"{name}-x7k2p"
        if tick == 1:
            head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]["labels"]
            self._pod(f"{cluster_name}-head", {**head, "ray.io/cluster": cluster_name, "ray.io/node-type": "head",
                                               "ray.io/group": "headgroup", "ray.io/serve": "true", "test/rayservice": name})
            self._status(name, {"pendingServiceStatus": self._service(cluster_name, "DEPLOYING"),
                                "conditions": self._conditions(False, "Initializing")})
        if tick == 2 and behaviour == "stuck":
            worker = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
            self._pod(f"{cluster_name}-prefill-worker-abcde", {**worker, "ray.io/cluster": cluster_name, "ray.io/node-type": "worker",
                                                               "ray.io/group": "prefill", "test/rayservice": name},
                      {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                           "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]})
            self.core.create_namespaced_event(self.ns, {
                "metadata": {"name": f"{cluster_name}-prefill.1", "namespace": self.ns}, "type": "Warning",
                "reason": "FailedScheduling", "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                "involvedObject": {"kind": "Pod", "name": f"{cluster_name}-prefill-worker-abcde", "namespace": self.ns},
                "lastTimestamp": _now()}, _preload_content=False)
        if tick == self.TICKS_TO_READY and behaviour == "ok":
            self._status(name, {"activeServiceStatus": self._service(cluster_name, "RUNNING"), "pendingServiceStatus": None,
                                "conditions": self._conditions(True, "NonZeroServeEndpoints"), "numServeEndpoints": 1})
        if tick == self.TICKS_TO_READY and behaviour == "fail":
            self._status(name, {"pendingServiceStatus": self._service(cluster_name, "DEPLOY_FAILED", "engine failed: CUDA out of memory")})

    def _pod(self, name: str, labels: dict, status: dict | None = None) -> None:
        try:
            self.core.create_namespaced_pod(self.ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": self.ns, "labels": labels},
                                                      "status": status or {"phase": "Running"}}, _preload_content=False)
        except client.ApiException as exc:
            if exc.status != 409:  # still there from a RayService of the same name
                raise

    def _status(self, name: str, status: dict) -> None:
        self.custom.patch_namespaced_custom_object_status("ray.io", "v1", self.ns, "rayservices", name, {"status": status})

    @staticmethod
    def _service(cluster_name: str, app_status: str, message: str = "") -> dict:
        return {"rayClusterName": cluster_name, "applicationStatuses": {"pd-llm": {
            "status": app_status, "message": message,
            "serveDeploymentStatuses": {"PDProxyServer": {"status": "HEALTHY" if app_status == "RUNNING" else "UPDATING"}}}}}

    @staticmethod
    def _conditions(ready: bool, reason: str) -> list[dict]:
        return [{"type": "Ready", "status": str(ready), "reason": reason, "message": "", "lastTransitionTime": _now()},
                {"type": "UpgradeInProgress", "status": "False", "reason": "NoPendingCluster", "message": "", "lastTransitionTime": _now()}]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def manifests():
    """Rendered overlays (kustomize only: the serve config's Ray validation is not the target's concern)."""
    return {env: render(ROOT / "overlays" / env, validate_serve_config=False) for env in ("local", "dev")}


def _record(manifests, env: str = "local", variant: str = "a") -> ReleaseRecord:
    """A release of the overlay; variants differ by one annotation, so digests differ."""
    objects = copy.deepcopy(manifests[env].objects)
    next(o for o in objects if o["kind"] == "RayService")["metadata"]["annotations"]["test/variant"] = variant
    return ReleaseRecord.of(dump_manifest(objects), name="pd-llm", model=manifests[env].spec.model.id, revision=variant * 40)


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


@pytest.fixture
def kuberay(cluster):
    k = FakeKubeRay(cluster, LOCAL_NS)
    yield k
    k.close()


def _target(cluster, namespace: str = LOCAL_NS, **kwargs) -> KubernetesTarget:
    return KubernetesTarget(namespace, api_client=cluster.client(), poll_s=0.05, restore_timeout_s=30, **kwargs)


class Lines(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def _release(target: KubernetesTarget, record: ReleaseRecord, progress=None) -> ReleaseRecord:
    progress = Lines() if progress is None else progress
    target.apply(record, progress)
    target.wait_ready(30, progress)
    return target.promote(["gate: promote"], "reports/x.md", progress)


def _eventually(condition, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the simulated KubeRay did not get there"
        time.sleep(0.05)


def _history(cluster) -> list[dict]:
    return json.loads(cluster.objects("configmaps")["pdops-history-pd-llm"]["data"]["history.json"])


def _desired(snapshot: dict) -> dict:
    """What the target writes: objects without the status, pods and events the simulated KubeRay moves."""
    return {k: {f: v for f, v in o.items() if f != "status"} for k, o in snapshot.items() if k[0] not in ("pods", "events")}


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
    assert [n for n, p in pods.items() if _selects(service, p)] == ["pd-llm-green-x7k2p-head"]
    assert set(cluster.objects("rayservices")) == {"pd-llm-green"}  # the old stable's GPUs are freed
    assert set(cluster.objects("poddisruptionbudgets")) == {"pd-llm-prefill-green", "pd-llm-decode-green"}
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
    assert set(cluster.objects("rayservices")) == {"pd-llm-blue"}
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
    _eventually(lambda: "pd-llm-blue-x7k2p-prefill-worker-abcde" in cluster.objects("pods"))
    progress = Lines()
    started = time.monotonic()
    with pytest.raises(TargetError) as timeout:
        target.wait_ready(0.5, progress)
    assert time.monotonic() - started < 10
    assert "not ready after" in timeout.value.problem
    text = timeout.value.render()
    assert "pod pd-llm-blue-x7k2p-prefill-worker-abcde: Pending, Unschedulable: 0/2 nodes are available" in text
    assert "event Warning FailedScheduling Pod/pd-llm-blue-x7k2p-prefill-worker-abcde" in text
    assert any(line.startswith("[rollout] pd-llm-blue: DEPLOYING (") for line in progress)
    target.rollback(["timeout"], None, Lines())
    assert cluster.objects("rayservices") == {}
    assert [r["verdict"] for r in _history(cluster)] == ["rollback"]


def test_rollback_redeploys_a_deleted_stable_from_the_history_configmap_alone(cluster, kuberay, manifests):
    a = _record(manifests)
    _release(_target(cluster), a)
    client.CustomObjectsApi(cluster.client()).delete_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices", "pd-llm-blue")
    assert cluster.objects("rayservices") == {}

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


def _node(name: str, phase: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": "g6e.12xlarge", "pdops.dev/phase": phase}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_capacity_check_refuses_a_candidate_that_does_not_fit_next_to_stable(cluster, manifests):
    core = client.CoreV1Api(cluster.client(KUBERAY_AGENT))
    for node in (_node("prefill-1", "prefill", 4), _node("decode-1", "decode", 4)):
        core.create_node(node, _preload_content=False)
    kuberay = FakeKubeRay(cluster, DEV_NS)
    try:
        target = _target(cluster, DEV_NS)
        progress = Lines()
        _release(target, _record(manifests, "dev", "a"), progress)  # 4 + 4 GPUs on an empty cluster: fits
        assert any("candidate needs 4 nvidia.com/gpu (prefill: 1 x 4)" in line and "free 4" in line for line in progress)
        history_before = cluster.objects("configmaps")

        with pytest.raises(TargetError) as refused:
            target.apply(_record(manifests, "dev", "b"), Lines())
        text = refused.value.render()
        assert "not enough GPUs for candidate pd-llm-green" in text
        assert "pdops.dev/phase=prefill}: candidate needs 4 nvidia.com/gpu (prefill: 1 x 4); allocatable 4 on 1 node(s), " \
               "stable uses 4, free 0: short by 4 — add 1 such node(s)" in text
        assert "decode" in text and "Pending" in text
        assert set(cluster.objects("rayservices")) == {"pd-llm-blue"}
        assert cluster.objects("configmaps") == history_before

        for node in (_node("prefill-2", "prefill", 4), _node("decode-2", "decode", 4)):
            core.create_node(node, _preload_content=False)
        assert target.apply(_record(manifests, "dev", "b"), Lines()).colour == "green"
    finally:
        kuberay.close()


def test_capacity_check_degrades_when_nodes_are_forbidden(cluster, manifests):
    cluster.emulator.forbidden = {"nodes"}
    progress = Lines()
    _target(cluster, DEV_NS).apply(_record(manifests, "dev"), progress)
    assert any("skipped: listing nodes is forbidden" in line and "pdops-node-reader" in line for line in progress)
    assert set(cluster.objects("rayservices")) == {"pd-llm-blue"}


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
    assert cluster.snapshot() == before


def test_crash_between_apply_and_promote_is_cleaned_up_by_a_new_target(cluster, kuberay, manifests):
    _release(_target(cluster), _record(manifests, variant="a"))
    crashed = _target(cluster)
    crashed.apply(_record(manifests, variant="b"), Lines())
    del crashed  # the process died here: no promote, no rollback

    fresh = _target(cluster)
    pending = fresh.status().candidate
    assert (pending.release.revision[0], pending.release.colour) == ("b", "green")
    fresh.rollback(["onExit: candidate left half way"], None, Lines())
    assert set(cluster.objects("rayservices")) == {"pd-llm-blue"}
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"
    assert [(r["revision"][0], r["verdict"]) for r in _history(cluster)] == [("a", "promote"), ("b", "rollback")]


def test_rollback_to_previous_restores_the_release_before_a_regressed_stable(cluster, kuberay, manifests):
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    _release(target, b)
    assert set(cluster.objects("rayservices")) == {"pd-llm-green"}

    done = _target(cluster).rollback(["canary: TTFT p90 regressed"], "reports/canary.md", Lines(), to_previous=True)
    assert "marked regressed" in done
    rayservices = cluster.objects("rayservices")
    assert set(rayservices) == {"pd-llm-blue"}
    assert rayservices["pd-llm-blue"]["metadata"]["annotations"]["pdops.dev/digest"] == a.digest
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"
    history = _history(cluster)
    assert [(r["revision"][0], r["verdict"]) for r in history] == [("a", "promote"), ("b", "regressed"), ("a", "promote")]
    assert target.status().last_good.colour == "blue"


def test_every_object_the_target_sends_validates_against_the_pinned_schemas(cluster, manifests):
    kuberay, target = FakeKubeRay(cluster, DEV_NS), _target(cluster, DEV_NS, capacity_check=False)
    try:
        with target.session():
            _release(target, _record(manifests, "dev"))
            lease = list(cluster.objects("leases").values())
    finally:
        kuberay.close()
    sent = lease + [o for plural in ("rayservices", "services", "configmaps", "poddisruptionbudgets", "serviceaccounts")
                    for o in cluster.objects(plural).values()]
    assert {o["kind"] for o in sent} == {"RayService", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "Lease"}
    assert "status" in cluster.objects("rayservices")["pd-llm-blue"]  # the simulated KubeRay's status is checked too
    findings = validate_objects(sent, Path(SCHEMAS), "emulator")
    assert [f for f in findings if f.severity == "error"] == []


def test_session_holds_a_lease_that_a_second_release_cannot_take(cluster):
    first, second = _target(cluster), _target(cluster)
    with first.session():
        lease = cluster.objects("leases")["pdops-release"]
        assert lease["spec"]["leaseDurationSeconds"] == 120 and "pid" in lease["spec"]["holderIdentity"]
        with pytest.raises(TargetError) as busy:
            with second.session():
                pass
        assert "another release is running in namespace pdops-local" in busy.value.problem
    assert cluster.objects("leases") == {}

    stale = {**lease, "spec": {**lease["spec"], "holderIdentity": "dead-pod pid 1", "renewTime": "2020-01-01T00:00:00.000000Z"}}
    client.CustomObjectsApi(cluster.client()).create_namespaced_custom_object("coordination.k8s.io", "v1", LOCAL_NS, "leases", stale)
    with second.session():
        assert cluster.objects("leases")["pdops-release"]["spec"]["holderIdentity"] != "dead-pod pid 1"
    with _target(cluster, dry_run=True).session():
        assert cluster.objects("leases") == {}


def test_leftovers_of_a_run_that_died_after_promote_are_removed(cluster, kuberay, manifests):
    target = _target(cluster)
    _release(target, _record(manifests, variant="a"))
    old_blue = cluster.objects("rayservices")["pd-llm-blue"]
    _release(target, _record(manifests, variant="b"))
    custom = client.CustomObjectsApi(cluster.client())
    def died_before_retiring_blue() -> None:
        custom.create_namespaced_custom_object("ray.io", "v1", LOCAL_NS, "rayservices",
                                               {k: v for k, v in old_blue.items() if k != "status"})

    died_before_retiring_blue()
    client.CoreV1Api(cluster.client()).patch_namespaced_service(  # ... and before switching the Service
        "pd-llm", LOCAL_NS, {"spec": {"selector": {"pdops.dev/colour": "blue"}}}, _preload_content=False)
    stable = _target(cluster).status().stable
    assert stable.state == "failed" and "Service pd-llm selects blue" in stable.detail
    assert "stable pd-llm@bbbbbbbbbbbb" in _target(cluster).rollback(["converge"], None, Lines())
    assert set(cluster.objects("rayservices")) == {"pd-llm-green"}
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"

    died_before_retiring_blue()
    progress = Lines()
    _target(cluster).apply(_record(manifests, variant="c"), progress)
    assert any("removing leftover RayService pd-llm-blue" in line for line in progress)
    assert cluster.objects("rayservices")["pd-llm-blue"]["metadata"]["annotations"]["test/variant"] == "c"
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"


def test_api_server_error_during_the_service_switch_keeps_users_on_the_old_stable(cluster, kuberay, manifests):
    """Emulated: the API server answers 500 to the promote's Service write (an etcd timeout)."""
    target, a, b = _target(cluster), _record(manifests, variant="a"), _record(manifests, variant="b")
    _release(target, a)
    target.apply(b, Lines())
    target.wait_ready(30, Lines())
    cluster.emulator.failing = {"services": 1}
    with pytest.raises(TargetError, match="refused to apply Service/pd-llm in pdops-local: 500"):
        target.promote(["gate: promote"], "reports/b.md", Lines())
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "blue"  # users on a
    assert set(cluster.objects("rayservices")) == {"pd-llm-blue", "pd-llm-green"}                 # nothing removed
    stable = _target(cluster).status().stable
    assert stable.release.digest == b.digest and stable.state == "failed" and "selects blue" in stable.detail

    _target(cluster).rollback(["finish the switch"], None, Lines())              # what the next run does
    assert cluster.objects("services")["pd-llm"]["spec"]["selector"]["pdops.dev/colour"] == "green"
    assert set(cluster.objects("rayservices")) == {"pd-llm-green"}
    assert [(r["revision"][0], r["verdict"]) for r in _history(cluster)] == [("a", "promote"), ("b", "promote")]
    assert _target(cluster).status().stable.state == "ready"
