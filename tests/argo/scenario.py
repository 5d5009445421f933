"""A test cluster for the committed workflows: the Kubernetes API emulator (kmock) with a simulated
KubeRay and GPU nodes, cluster networking to engines on 127.0.0.1, and the step pods' KUBECONFIG.

The emulator and the simulated KubeRay are the unit tier's (tests/unit/test_kubernetes_target.py,
which documents what they do and do not emulate); they move to tests/fakes/ with the Kubernetes
emulator work, and this module follows them there.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from tests.argo.network import ServiceNetwork
from tests.argo.pod import PodRunner
from tests.argo.spec import WorkflowSpec, load_workflow_spec
from tests.argo.workflow import Run, run_workflow
from tests.conftest import ROOT
from tests.fakes.known_timing_server import Broken, KnownTimingServer
from tests.unit.test_kubernetes_target import Cluster, FakeKubeRay
from workflows.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord
from workflows.targets.kubernetes import KubernetesTarget

ARGO = ROOT / "kustomize" / "argo"
REPO_URL = "https://github.com/pdops/pdops.git"   # the template's default repo-url; served from ROOT
ENV, NS, RELEASE = "dev", "llm-dev", "pd-llm"
SERVE_PORT, METRICS_PORT = 8000, 8080  # the head container's `serve` and `metrics` ports in the overlays


def committed(file: str) -> WorkflowSpec:
    return load_workflow_spec(next(d for d in yaml.safe_load_all((ARGO / file).read_text()) if d))


def model_id() -> str:
    return yaml.safe_load((ROOT / "overlays" / ENV / "release.yaml").read_text())["model"]["id"]


@dataclass
class Engines:
    """One engine per colour (what a RayCluster of that colour would serve)."""
    servers: dict[str, KnownTimingServer] = field(default_factory=dict)

    def set(self, colour: str, **behaviour) -> KnownTimingServer:
        if colour in self.servers:
            self.servers[colour].stop()
        srv = KnownTimingServer(model=model_id(), first_token_delay=behaviour.pop("first_token_delay", 0.05),
                                inter_token_delay=behaviour.pop("inter_token_delay", 0.01),
                                broken=Broken(**behaviour.pop("broken", {})), **behaviour)
        self.servers[colour] = srv.start()
        return srv

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stop()


class PipelineCluster:
    def __init__(self, root: Path, runner_factory, revision: str) -> None:
        self._closed = False
        self.cluster = Cluster()
        self.kuberay = FakeKubeRay(self.cluster, NS)
        self.revision = revision
        core = client.CoreV1Api(self.cluster.client())
        for i, phase in enumerate(("prefill", "decode")):  # dev's node groups (overlays/dev/node-groups.yaml)
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"g6e-{phase}-{i}", "labels": {
                "node.kubernetes.io/instance-type": "g6e.12xlarge", "pdops.dev/phase": phase}},
                "status": {"allocatable": {"nvidia.com/gpu": "16"}, "conditions": [{"type": "Ready", "status": "True"}]}},
                _preload_content=False)
        self.engines = Engines()
        for colour in ("blue", "green"):
            self.engines.set(colour)
        self.net = ServiceNetwork()
        self.net.service(f"{RELEASE}.{NS}.svc.cluster.local", SERVE_PORT, lambda: self._backend(self._selected()))
        for colour in ("blue", "green"):
            self.net.service(f"{RELEASE}-{colour}-serve-svc.{NS}.svc.cluster.local", SERVE_PORT,
                             lambda c=colour: self._backend(c))
            self.net.service(f"{RELEASE}-{colour}-head-svc.{NS}.svc.cluster.local", METRICS_PORT,
                             lambda c=colour: self._backend(c))
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.cluster.url}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "pd-release"}}],
            "users": [{"name": "pd-release", "user": {"token": "pd-release-sa-token"}}]}))
        self.runner: PodRunner = runner_factory(kubeconfig=kubeconfig, hosts=self.net.hosts)
        self.work = root / "runs"

    # ---- what the services reach ----

    def _selected(self) -> str | None:
        svc = self.cluster.objects("services").get(RELEASE)
        return (svc or {}).get("spec", {}).get("selector", {}).get("pdops.dev/colour")

    def _backend(self, colour: str | None):
        """A colour's engine while its RayService exists (its pods are gone with it)."""
        if colour is None or f"{RELEASE}-{colour}" not in self.cluster.objects("rayservices"):
            return None
        return ("127.0.0.1", self.engines.servers[colour].port)

    # ---- state ----

    def target(self) -> KubernetesTarget:
        return KubernetesTarget(NS, api_client=self.cluster.client("seed"), poll_s=0.05, restore_timeout_s=30)

    def seed(self, variant: str, promote: bool = True) -> ReleaseRecord:
        """A release of overlays/dev made by hand (as an earlier run would have), differing from the
        revision under test by one annotation."""
        rendered = render(ROOT / "overlays" / ENV, validate_serve_config=False)
        objects = copy.deepcopy(rendered.objects)
        next(o for o in objects if o["kind"] == "RayService")["metadata"].setdefault("annotations", {})["test/variant"] = variant
        record = ReleaseRecord.of(dump_manifest(objects), name=RELEASE, model=rendered.spec.model.id, revision=variant * 40)
        target, say = self.target(), (lambda _line: None)
        record = target.apply(record, say)
        target.wait_ready(30, say)
        return target.promote([f"seeded {variant}"], None, say) if promote else record

    def history(self) -> list[dict]:
        cm = self.cluster.objects("configmaps").get(f"pdops-history-{RELEASE}")
        return json.loads(cm["data"]["history.json"]) if cm else []

    def stable_colour(self) -> str | None:
        return self._selected()

    def rayservices(self) -> set[str]:
        return set(self.cluster.objects("rayservices"))

    # ---- runs ----

    def submit(self, file: str, parameters: dict[str, str], **kw) -> Run:
        params = {"environment": ENV, "revision": self.revision, **parameters}
        return run_workflow(committed(file), self.runner, work=self.work, parameters=params,
                            generate_name=file.removesuffix(".yaml") + "-", repos={REPO_URL: ROOT}, **kw)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.net.close()
        self.engines.close()
        self.kuberay.close()
        self.cluster.close()
