"""A fake KubeRay operator, modelled on ray-operator v1.7.0 (ray-project/kuberay tag ray-operator/v1.7.0).

What it does, with the upstream code it follows:
- finalizer `ray.io/rayservice-finalizer` added before anything else; on delete the RayClusters
  go first and the finalizer is removed only once none is left, so a deleted RayService lingers
  with a deletionTimestamp (rayservice_controller.go Reconcile, cleanUpRayClusterInstance;
  `terminate_ticks` stands for KubeRay's requeue and the pods' termination);
- validation failure: condition Ready=False reason `ValidationFailed` with the error, a Warning
  event, nothing built (validateRayService; here: `behaviour[...] = "invalid"`, or a RayService
  without workerGroupSpecs);
- `ray.io/initializing-timeout`: not ready by then -> Ready=False reason `InitializingTimeout`,
  terminal, clusters removed (markFailedOnInitializingTimeout, isInitializingTimeout);
- a RayCluster `<rs>-<5 chars>` owned by the RayService; pods labelled as common/pod.go labelPod
  and BuildPod do: template labels, ray.io/cluster|node-type|group|is-ray-node|identifier, and
  `ray.io/serve`: "true" on workers (readiness probe decides), "false" on the head until its
  proxy is healthy (updateHeadPodServeLabel; `head_unhealthy` keeps it false);
- Services `<rs>-head-svc` (ray.io/cluster=<active>, node-type=head) and `<rs>-serve-svc`
  (ray.io/cluster=<active>, ray.io/serve=true), utils.GenerateHeadServiceName/GenerateServeServiceName
  and common/service.go BuildServeService;
- status: pendingServiceStatus while deploying, activeServiceStatus once RUNNING, conditions Ready
  (NonZeroServeEndpoints once the serve Service has a ready endpoint) and UpgradeInProgress
  (calculateConditions); `fail` -> application DEPLOY_FAILED with a message;
- a changed rayClusterConfig builds a second (pending) RayCluster unless
  spec.upgradeStrategy.type is None (isZeroDowntimeUpgradeEnabled);
- the RayCluster keeps its replica counts: a deleted worker pod is replaced (new name, new IP).
- the Serve applications of spec.serveConfigV2 as Ray Serve builds them: application statuses keyed
  by each application's name, with the deployments its import path creates (`build_pd_openai_app`:
  PDProxyServer, Prefill:/Decode:<model>; `build_openai_app`, one aggregated engine:
  LLMServer:<model> and OpenAiIngress; ray/llm/_internal/serve/core/ingress/builder.py
  build_openai_app and core/server/builder.py build_llm_deployment name them). KubeRay itself
  never looks inside an application: it submits serveConfigV2 and reports what Serve says.
Behaviours per RayService name or `pdops.dev/colour` label: ok | fail | stuck | invalid | head_unhealthy.
`engines[name or colour or pdops.dev/role]`: EngineApp keywords for that RayService's application
(e.g. `{"server": DiffFake}` for answers that are a function of the request, as one model's are).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.fakes.kube.controllers import disruption, endpoint_slices
from tests.fakes.kube.engine import EngineApp
from tests.fakes.kube.network import Network
from tests.fakes.kube.scheduler import schedule
from tests.fakes.kube.store import BY_KIND, ApiError, Store, now

FINALIZER = "ray.io/rayservice-finalizer"
MANAGER = "kuberay-operator"
RS, RC, POD, SVC, EVENT = (BY_KIND[k] for k in ("RayService", "RayCluster", "Pod", "Service", "Event"))


@dataclass
class _Cluster:
    name: str
    config_hash: str
    tick: int = 0
    app: EngineApp | None = None
    model: str = "pdops-tiny"
    apps: dict[str, list[str]] = field(default_factory=dict)   # Serve application -> its deployments
    aggregated: bool = False                                    # build_openai_app: one engine, no KV transfer


@dataclass
class FakeKubeRay:
    store: Store
    network: Network
    ticks_to_ready: int = 3
    terminate_ticks: int = 6
    behaviour: dict[str, str] = field(default_factory=dict)
    clusters: dict[str, _Cluster] = field(default_factory=dict)   # RayService uid -> its cluster
    terminating: dict[str, int] = field(default_factory=dict)
    pod_ips: dict[tuple[str, str], str] = field(default_factory=dict)
    error: BaseException | None = None
    engine: dict[str, Any] = field(default_factory=dict)  # EngineApp keywords, e.g. longer streams
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # per RayService name / colour / role
    tick_s: float = 0.05   # the reconcile period (run() sets it): ticks stand for time in _timed_out

    def __post_init__(self) -> None:
        self.store.listeners.append(self._changed)

    def _changed(self, key, obj) -> None:
        if key[0] is POD and obj is None and (ip := self.pod_ips.pop(key[1:], None)):
            self.network.loop.call_soon_threadsafe(lambda: self.network.loop.create_task(self.network.close(ip)))

    async def run(self, tick_s: float) -> None:
        self.tick_s, settled = tick_s, -1
        while True:
            try:
                # The two controllers are functions of the store alone: with no write since they last ran
                # (their own writes included) they would write nothing, so they sleep through that tick.
                if self.store.revision != settled:
                    endpoint_slices(self.store)
                    disruption(self.store)
                    settled = self.store.revision
                for rs in self.store.list(RS, None)[0]:
                    try:
                        await self.reconcile(rs)
                    except ApiError as exc:
                        if exc.code not in (404, 409):  # gone or changed since the list: the next tick sees it
                            raise
            except Exception as exc:  # noqa: BLE001 - kept for the test to report, not lost in a task
                self.error = exc
                raise
            await asyncio.sleep(tick_s)

    def _mode(self, rs: dict) -> str:
        meta = rs["metadata"]
        return self.behaviour.get(meta["name"]) or self.behaviour.get((meta.get("labels") or {}).get("pdops.dev/colour", ""), "ok")

    async def reconcile(self, rs: dict) -> None:
        meta, ns, name, uid = rs["metadata"], rs["metadata"]["namespace"], rs["metadata"]["name"], rs["metadata"]["uid"]
        if meta.get("deletionTimestamp"):
            for cluster in self.store.list(RC, ns, lambda l: l.get("ray.io/originated-from-cr-name") == name)[0]:
                self.store.delete(RC, ns, cluster["metadata"]["name"])
            self._stop(uid)
            self.terminating[uid] = self.terminating.get(uid, 0) + 1
            if self.terminating[uid] >= self.terminate_ticks:
                meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
                self.store.update(RS, ns, name, rs, MANAGER)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            meta.setdefault("finalizers", []).append(FINALIZER)
            self.store.update(RS, ns, name, rs, MANAGER)
            return
        status = rs.get("status") or {}
        reasons = {c["type"]: c.get("reason") for c in status.get("conditions") or []}
        if reasons.get("Ready") in ("ValidationFailed", "InitializingTimeout"):
            return
        problem = self._invalid(rs)
        if problem:
            self._event(ns, rs, "Warning", "InvalidRayServiceSpec", f"{ns}/{name}: {problem}")
            return self._status(rs, {"conditions": _conditions("False", "ValidationFailed", problem)})
        config_hash = hashlib.sha256(json.dumps(rs["spec"]["rayClusterConfig"], sort_keys=True).encode()).hexdigest()
        cluster = self.clusters.get(uid)
        if cluster is None:
            cluster = self.clusters[uid] = self._new_cluster(rs, config_hash)
        elif cluster.config_hash != config_hash and (rs["spec"].get("upgradeStrategy") or {}).get("type") != "None":
            self._new_cluster(rs, config_hash)  # a pending cluster beside the active one (not switched to here)
            cluster.config_hash = config_hash
        cluster.tick += 1
        if self._timed_out(rs, status):
            self._stop(uid)
            for rc in self.store.list(RC, ns, lambda l: l.get("ray.io/originated-from-cr-name") == name)[0]:
                self.store.delete(RC, ns, rc["metadata"]["name"])
            message = f"RayService failed to initialize within {meta['annotations']['ray.io/initializing-timeout']}"
            self._event(ns, rs, "Warning", "InitializingTimeout", message)
            return self._status(rs, {"conditions": _conditions("False", "InitializingTimeout", message)})
        await self._run_cluster(rs, cluster, self._mode(rs))

    # ---- one cluster ----

    def _new_cluster(self, rs: dict, config_hash: str) -> _Cluster:
        ns, name = rs["metadata"]["namespace"], rs["metadata"]["name"]
        apps = _applications(rs)
        cluster = _Cluster(f"{name}-{uuid.uuid4().hex[:5]}", config_hash, model=_model(rs), apps=apps,
                           aggregated=bool(apps) and all(not d[0].startswith("PDProxy") for d in apps.values()))
        self.store.create(RC, ns, {"metadata": {"name": cluster.name, "labels": {
            "ray.io/originated-from-cr-name": name, "ray.io/originated-from-crd": "RayService"},
            "ownerReferences": [_owner(rs)]}, "spec": rs["spec"]["rayClusterConfig"]}, MANAGER)
        for svc, selector in ((f"{name}-head-svc", {"ray.io/cluster": cluster.name, "ray.io/node-type": "head"}),
                              (f"{name}-serve-svc", {"ray.io/cluster": cluster.name, "ray.io/serve": "true"})):
            if self.store.find(SVC, ns, svc) is None:
                ports = [{"name": "serve", "port": 8000, "targetPort": 8000}] if "serve" in svc else \
                    [{"name": p, "port": n, "targetPort": n} for p, n in (("gcs", 6379), ("dashboard", 8265), ("serve", 8000), ("metrics", 8080))]
                self.store.create(SVC, ns, {"metadata": {"name": svc, "ownerReferences": [_owner(rs)]},
                                            "spec": {"selector": selector, "ports": ports}}, MANAGER)
        self._status(rs, {"pendingServiceStatus": {"rayClusterName": cluster.name},
                          "conditions": _conditions("False", "Initializing", "RayService is initializing")})
        return cluster

    async def _run_cluster(self, rs: dict, cluster: _Cluster, mode: str) -> None:
        ns, spec = rs["metadata"]["namespace"], rs["spec"]["rayClusterConfig"]
        rc = self.store.find(RC, ns, cluster.name)
        if rc is None:
            return
        pods = {p["metadata"]["name"]: p for p in self.store.list(POD, ns, lambda l: l.get("ray.io/cluster") == cluster.name)[0]}
        groups = [("headgroup", "head", spec["headGroupSpec"], 1)] + [
            (g["groupName"], "worker", g, max(int(g.get("replicas") or 0), int(g.get("minReplicas") or 0)) * int(g.get("numOfHosts", 1)))
            for g in spec.get("workerGroupSpecs") or []]
        running = cluster.tick >= self.ticks_to_ready and mode in ("ok", "head_unhealthy")
        for group, node_type, group_spec, replicas in groups:
            have = [p for p in pods.values() if p["metadata"]["labels"].get("ray.io/group") == group]
            for _ in range(replicas - len(have)):
                pod = self._pod(rs, rc, cluster, group, node_type, group_spec)
                pods[pod["metadata"]["name"]] = pod
        for name, pod in list(pods.items()):
            if not (pod.get("spec") or {}).get("nodeName"):
                pods[name] = self._bind(ns, pod, mode == "stuck" and pod["metadata"]["labels"]["ray.io/node-type"] == "worker")
        running = running and all((p.get("status") or {}).get("podIP") for p in pods.values())  # Serve starts once every pod runs
        if running and cluster.app is None:
            labels = rs["metadata"].get("labels") or {}
            mine = next((self.engines[k] for k in (rs["metadata"]["name"], labels.get("pdops.dev/colour"),
                                                   labels.get("pdops.dev/role")) if k in self.engines), {})
            cluster.app = EngineApp(cluster.model, **{**self.engine, **mine})
        for pod in pods.values():
            await self._pod_state(ns, cluster, pod, running, mode)
        if cluster.tick >= 2 and not running and mode != "fail" or 2 <= cluster.tick < self.ticks_to_ready:
            self._status(rs, {"pendingServiceStatus": _service(cluster, "DEPLOYING")})  # Serve app submitted
        if mode == "fail" and cluster.tick == self.ticks_to_ready:
            self._status(rs, {"pendingServiceStatus": _service(cluster, "DEPLOY_FAILED",
                                                               "engine failed: CUDA out of memory")})
        if running:
            endpoints = len(self.network.endpoints(ns, f"{rs['metadata']['name']}-serve-svc"))
            ready = endpoints > 0
            self._status(rs, {"activeServiceStatus": _service(cluster, "RUNNING"), "pendingServiceStatus": {},
                              "numServeEndpoints": endpoints, "observedGeneration": rs["metadata"].get("generation"),
                              "conditions": _conditions(str(ready), "NonZeroServeEndpoints" if ready else "ZeroServeEndpoints",
                                                        "", upgrade=("False", "NoPendingCluster"))})

    def _pod(self, rs, rc, cluster: _Cluster, group: str, node_type: str, group_spec: dict) -> dict:
        ns, template = rs["metadata"]["namespace"], group_spec.get("template") or {}
        labels = {"ray.io/is-ray-node": "yes", "ray.io/identifier": f"{cluster.name}-{node_type}",
                  "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator",
                  **((template.get("metadata") or {}).get("labels") or {}),
                  "ray.io/cluster": cluster.name, "ray.io/node-type": node_type, "ray.io/group": group,
                  "ray.io/serve": "false" if node_type == "head" else "true"}
        prefix = f"{cluster.name}-head-" if node_type == "head" else f"{cluster.name}-{group}-worker-"
        return self.store.create(POD, ns, {"metadata": {"generateName": prefix, "labels": labels, "ownerReferences": [_owner(rc)]},
                                          "spec": template.get("spec") or {}}, MANAGER)

    def _bind(self, ns: str, pod: dict, stuck: bool) -> dict:
        """The scheduler (scheduler.py; `stuck` forces it to find no node), then the kubelet starts it."""
        name = pod["metadata"]["name"]
        node, why = (None, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.") if stuck else schedule(self.store, pod)
        if node is None:
            conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}]
            if (pod.get("status") or {}).get("conditions") != conditions:
                pod["status"] = {"phase": "Pending", "conditions": conditions}
                self._event(ns, pod, "Warning", "FailedScheduling", why)
                return self.store.update(POD, ns, name, pod, "default-scheduler", subresource="status")
            return pod
        pod["spec"]["nodeName"] = node  # pods/binding
        pod = self.store.update(POD, ns, name, pod, "default-scheduler")
        ip = self.pod_ips[(ns, name)] = self.network.pod_ip()
        pod["status"] = {"phase": "Running", "podIP": ip, "conditions": [{"type": "PodScheduled", "status": "True"},
                                                                         {"type": "Ready", "status": "False"}]}
        return self.store.update(POD, ns, name, pod, "kubelet", subresource="status")

    async def _pod_state(self, ns: str, cluster: _Cluster, pod: dict, running: bool, mode: str) -> None:
        """Processes on the pod's address, its Ready condition and (head) its serve label."""
        name, status, labels = pod["metadata"]["name"], pod.get("status") or {}, pod["metadata"]["labels"]
        ip = status.get("podIP")
        if not ip or not running:
            return
        phase = labels.get("pdops.dev/phase") if labels["ray.io/node-type"] == "worker" else None
        await self.network.listen(ip, 8000, self.network.forward_to(lambda: cluster.app.address if cluster.app else None))
        await self.network.listen(ip, 8080, _metrics_handler(lambda: self._metrics(ns, cluster, name, phase, ip)))
        head = labels["ray.io/node-type"] == "head"
        serve = "false" if head and mode == "head_unhealthy" else "true"
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                           {"type": "Ready", "status": "True", "lastTransitionTime": now()}]
            pod = self.store.update(POD, ns, name, pod, "kubelet", subresource="status")
        if labels.get("ray.io/serve") != serve:  # updateHeadPodServeLabel: an Update of the pod
            pod["metadata"]["labels"]["ray.io/serve"] = serve
            self.store.update(POD, ns, name, pod, MANAGER)

    def _metrics(self, ns: str, cluster: _Cluster, pod: str, phase: str | None, ip: str) -> str:
        if cluster.app is None:
            return ""
        workers = self.store.list(POD, ns, lambda l: l.get("ray.io/cluster") == cluster.name and l.get("ray.io/node-type") == "worker")[0]
        phases: dict[str, list[str]] = {}
        for p in workers:
            if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp"):
                phases.setdefault(p["metadata"]["labels"].get("pdops.dev/phase", "engine"), []).append(p["metadata"]["name"])
        cluster.app.assign(phases)
        return cluster.app.metrics(pod, phase, ip, f"{phase}-{pod[-5:]}", cluster.model, cluster.aggregated)

    def _stop(self, uid: str) -> None:
        cluster = self.clusters.pop(uid, None)
        if cluster and cluster.app:
            cluster.app.stop()

    def stop(self) -> None:
        for uid in list(self.clusters):
            self._stop(uid)

    # ---- helpers ----

    def _invalid(self, rs: dict) -> str | None:
        if self._mode(rs) == "invalid":
            return "spec.rayClusterConfig.headGroupSpec.template.spec.containers[0].image: the image is not allowed"
        if not rs["spec"].get("rayClusterConfig", {}).get("headGroupSpec"):
            return "spec.rayClusterConfig.headGroupSpec is required"
        return None

    def _timed_out(self, rs: dict, status: dict) -> bool:
        limit = ((rs["metadata"].get("annotations") or {}).get("ray.io/initializing-timeout") or "").rstrip("s")
        if not limit or any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
            return False
        cluster = self.clusters.get(rs["metadata"]["uid"])
        return cluster is not None and cluster.tick * self.tick_s > float(limit)

    def _status(self, rs: dict, status: dict) -> None:
        ns, name = rs["metadata"]["namespace"], rs["metadata"]["name"]
        current = self.store.get(RS, ns, name)
        old = {c["type"]: c for c in (current.get("status") or {}).get("conditions") or []}
        for cond in status.get("conditions") or []:  # meta.SetStatusCondition: the time moves only with the status
            if cond["type"] in old and old[cond["type"]]["status"] == cond["status"]:
                cond["lastTransitionTime"] = old[cond["type"]]["lastTransitionTime"]
        merged = {**(current.get("status") or {}), **status}
        if merged != current.get("status"):
            current["status"] = merged
            self.store.update(RS, ns, name, current, MANAGER, subresource="status")

    def _event(self, ns: str, obj: dict, kind: str, reason: str, message: str) -> None:
        self.store.create(EVENT, ns, {"metadata": {"generateName": f"{obj['metadata']['name']}."}, "type": kind, "reason": reason,
                                      "message": message, "lastTimestamp": now(), "involvedObject": {
                                          "kind": obj.get("kind", ""), "name": obj["metadata"]["name"], "namespace": ns}}, MANAGER)


def _owner(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _serve_apps(rs: dict) -> list[dict]:
    try:
        apps = yaml.load(rs["spec"].get("serveConfigV2") or "", Loader=yaml.CSafeLoader)["applications"]  # as server.py
        return [a for a in apps if isinstance(a, dict)]
    except (TypeError, KeyError, ValueError):
        return []


def _model(rs: dict) -> str:
    try:
        args = _serve_apps(rs)[0]["args"]
        config = args.get("prefill_config") or (args.get("llm_configs") or [None])[0] or args
        return config["model_loading_config"]["model_id"]
    except (TypeError, KeyError, IndexError, ValueError):
        return "pdops-tiny"


def _applications(rs: dict) -> dict[str, list[str]]:
    """Application name -> the deployments Ray Serve LLM builds for its import path."""
    model, out = _model(rs), {}
    for app in _serve_apps(rs):
        if str(app.get("import_path", "")).endswith(":build_openai_app"):
            out[app.get("name", "default")] = [f"LLMServer:{model}", "OpenAiIngress"]
        else:
            out[app.get("name", "default")] = ["PDProxyServer", f"Prefill:{model}", f"Decode:{model}"]
    return out or {"pd-llm": ["PDProxyServer"]}


def _service(cluster: _Cluster, app_status: str, message: str = "") -> dict:
    deployment = "HEALTHY" if app_status == "RUNNING" else "UPDATING"
    return {"rayClusterName": cluster.name, "applicationStatuses": {
        name: {"status": app_status, "message": message,
               "serveDeploymentStatuses": {d: {"status": deployment} for d in deployments}}
        for name, deployments in (cluster.apps or {"pd-llm": ["PDProxyServer"]}).items()}}


def _conditions(ready: str, reason: str, message: str, upgrade: tuple[str, str] = ("False", "Initializing")) -> list[dict]:
    return [{"type": "Ready", "status": ready, "reason": reason, "message": message, "lastTransitionTime": now()},
            {"type": "UpgradeInProgress", "status": upgrade[0], "reason": upgrade[1], "message": "", "lastTransitionTime": now()}]


def _metrics_handler(text):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
                body = text().encode() if path.startswith(b"/metrics") else b"not found\n"
                code = b"200 OK" if path.startswith(b"/metrics") else b"404 Not Found"
                writer.write(b"HTTP/1.1 " + code + b"\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            writer.close()
    return handle
