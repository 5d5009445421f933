"""One test cluster: API server + fake KubeRay + pod/Service network, on its own thread and event loop."""
from __future__ import annotations

import asyncio
import copy
import os
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp.web
import yaml

from tests.fakes.kube.kuberay import FakeKubeRay
from tests.fakes.kube.network import Network
from tests.fakes.kube.server import ApiServer, Rbac, Request
from tests.fakes.kube.store import BY_KIND, RESOURCES, Store

DEFAULT_NAMESPACES = ("default", "pdops", "pdops-local", "llm-dev", "llm-staging", "llm-prod")
# One CPU node, room for both colours of the local overlay (5 CPU, 16 GiB each); GPU tests add their nodes.
DEFAULT_NODES = ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1", "labels": {"kubernetes.io/hostname": "cpu-1"}},
                  "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                             "conditions": [{"type": "Ready", "status": "True"}]}},)


class TestCluster:
    __test__ = False  # not a pytest test class

    def __init__(self, namespaces: tuple[str, ...] = DEFAULT_NAMESPACES, kubeconfig: str | os.PathLike | None = None,
                 tick_s: float = 0.05, nodes: tuple[dict, ...] | None = None) -> None:
        nodes = DEFAULT_NODES if nodes is None else nodes
        self.store = Store()
        for ns in namespaces:
            self.store.create(BY_KIND["Namespace"], "", {"metadata": {"name": ns}}, "test")
        for node in nodes:
            self.add_node(node)
        self.api = ApiServer(self.store)
        started, failed = threading.Event(), []

        async def serve() -> None:
            try:
                self.loop = asyncio.get_running_loop()
                self.network = Network(self.store, self.loop)
                self.kuberay = FakeKubeRay(self.store, self.network)
                runner = aiohttp.web.AppRunner(self.api.app, access_log=None)
                await runner.setup()
                site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
                self._stop = asyncio.Event()
                task = asyncio.create_task(self.kuberay.run(tick_s))
            except BaseException as exc:  # noqa: BLE001
                failed.append(exc)
                started.set()
                return
            started.set()
            await self._stop.wait()
            task.cancel()
            self.kuberay.stop()
            for ip, port in list(self.network.listeners):
                await self.network.close(ip, port)
            await runner.cleanup()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name="test-cluster", daemon=True)
        self._thread.start()
        started.wait(15)
        if failed:
            raise failed[0]
        self.kubeconfig = Path(kubeconfig) if kubeconfig else Path(tempfile.mkstemp(prefix="kubeconfig-", suffix=".yaml")[1])
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))

    def enforce_rbac(self, objects: list[dict]) -> Rbac:
        """RBAC from `objects` (Roles, RoleBindings) for the tokens entered in the returned Rbac's `tokens` (a step
        pod's, by tests/argo/pod.py). Clients with any other token may still do everything."""
        self.api.rbac = Rbac.of(objects)
        return self.api.rbac

    def add_node(self, node: dict) -> dict:
        """A Node as the kubelet registers it (status included)."""
        return self.store.create(BY_KIND["Node"], "", node, "kubelet")

    # ---- clients ----

    def client(self, agent: str = "pdops-test"):
        from kubernetes import client
        configuration = client.Configuration()
        configuration.host = self.url
        api = client.ApiClient(configuration)
        api.user_agent = agent
        return api

    # ---- reading what happened ----

    @staticmethod
    def store_resource(plural: str):
        return next(r for r in RESOURCES if r.plural == plural)

    def objects(self, plural: str, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """Stored objects of a resource by name (terminating ones included: check deletionTimestamp)."""
        res = next(r for r in RESOURCES if r.plural == plural)
        return {o["metadata"]["name"]: o for o in self.store.list(res, namespace)[0]}

    def snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        with self.store.lock:
            return {(res.plural, name): copy.deepcopy(o) for (res, _, name), o in self.store.objects.items()}

    def writes(self, agent: str = "pdops-test") -> list[Request]:
        return [r for r in list(self.api.requests) if r.method in ("POST", "PUT", "PATCH", "DELETE") and r.agent == agent]

    @property
    def faults(self):
        return self.api.faults

    # ---- the network ----

    def hosts(self) -> str:
        """/etc/hosts lines: every Service's cluster DNS names -> its clusterIP."""
        return self.network.hosts()

    def resolve(self, url: str) -> str:
        """`url` with a `<svc>.<ns>.svc.cluster.local` host replaced by the Service's clusterIP."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        if not host.endswith(".svc.cluster.local"):
            return url
        name, ns = host.split(".")[:2]
        svc = self.store.find(BY_KIND["Service"], ns, name)
        if svc is None:
            return url
        return urlunsplit(parts._replace(netloc=f"{svc['spec']['clusterIP']}:{parts.port}"))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        assert self.kuberay.error is None, f"the fake KubeRay failed: {self.kuberay.error!r}"


def start_cluster(kubeconfig: str | os.PathLike | None = None, namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
                  tick_s: float = 0.05, nodes: tuple[dict, ...] | None = None) -> TestCluster:
    """`nodes`: Node objects (default: one 32-CPU node); the fake scheduler places pods on them."""
    return TestCluster(namespaces, kubeconfig, tick_s, nodes)
