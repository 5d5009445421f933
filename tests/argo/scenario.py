"""A test cluster for the committed workflows: tests/fakes/kube (the Kubernetes API emulator, the fake
KubeRay v1.7 with engines behind real Serve proxies on pod IPs, Services with clusterIPs in 127/8
and kube-proxy forwarding; see its docstrings for what it models) plus what the dev overlay needs:
GPU nodes matching its node groups, and engines whose latency or compatibility a test chooses.

The steps reach it as pods do: KUBECONFIG (for the ServiceAccount token) and /etc/hosts from the
cluster's Services at the moment each pod starts (cluster DNS).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from kubernetes.utils import parse_quantity

from tests.argo.pod import PodRunner
from tests.argo.spec import WorkflowSpec, load_workflow_spec
from tests.argo.workflow import Run, run_workflow
from tests.conftest import ROOT
from tests.fakes.known_timing_server import Broken
from tests.fakes.kube import start_cluster
from tests.fakes.kube.engine import EngineApp
from tests.measure_lock import measuring
from workflows.render.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord
from workflows.targets.kubernetes import KubernetesTarget

ARGO = ROOT / "kustomize" / "argo"
REPO_URL = "https://github.com/pdops/pdops.git"   # the template's default repo-url; served from ROOT
ENV, NS, RELEASE = "dev", "llm-dev", "pd-llm"


_NEXT_ENGINE: dict = {}


# The tier's engines stream a token every 20 ms (EngineApp's default is 5 ms), as a real decode step of a large
# model does, not faster. At 5 ms a dev validation's load (1,600 requests at concurrency 16) kept its client's
# worker at 28-38 % of a core and the fake engines busy in proportion, against 11-13 % at 20 ms (alone, 2026-12-07,
# scripts/bench_client_load.py; docs/measurements.md); beside the unit tier the machine was then oversubscribed and the
# client's event loop stalled (CI run 18: lag p99 53 ms > 10 ms at load 2.6), which voids the measurement and
# rolls a good release back. The load takes 16 s instead of 6.
INTER_TOKEN_DELAY_S = 0.02


def engine_factory(model: str) -> EngineApp:
    """Replaces EngineApp in the fake KubeRay (patched for the session by the tier's conftest)."""
    behaviour = {"inter_token_delay": INTER_TOKEN_DELAY_S, **_NEXT_ENGINE}
    _NEXT_ENGINE.clear()
    app = EngineApp(model, **{k: v for k, v in behaviour.items() if k != "broken"})
    if "broken" in behaviour:
        app.server.broken = Broken(**behaviour["broken"])
    return app


def overlay_nodes(per_selector: int = 2) -> tuple[dict, ...]:
    """Nodes for overlays/dev: for every pod group of its RayService (head and workers), nodes with the
    group's nodeSelector labels and room for one pod each, `per_selector` of them (both colours)."""
    rendered = render(ROOT / "overlays" / ENV, validate_serve_config=False)
    rc = next(o for o in rendered.objects if o["kind"] == "RayService")["spec"]["rayClusterConfig"]
    nodes: dict[tuple, dict] = {}
    for group in [rc["headGroupSpec"], *rc.get("workerGroupSpecs", [])]:
        spec = group["template"]["spec"]
        selector = tuple(sorted((spec.get("nodeSelector") or {}).items()))
        want: dict[str, float] = {}
        for c in spec.get("containers", []):
            for k, v in ((c.get("resources") or {}).get("requests") or (c.get("resources") or {}).get("limits") or {}).items():
                want[k] = want.get(k, 0) + _quantity(v)
        have = nodes.setdefault(selector, {})
        for k, v in want.items():
            have[k] = max(have.get(k, 0), v)
    out = []
    for i, (selector, room) in enumerate(nodes.items()):
        allocatable = {k: _format(k, v) for k, v in room.items()} | {"pods": "110"}
        for j in range(per_selector):
            name = f"node-{i}-{j}"
            out.append({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": {**dict(selector), "kubernetes.io/hostname": name}},
                        "status": {"allocatable": allocatable, "capacity": allocatable,
                                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return tuple(out)


def _quantity(v) -> float:
    return float(parse_quantity(v))   # the official client's parser, as workflows/targets/kube/capacity.py


def _format(key: str, v: float) -> str:
    return f"{int(v // 2**30)}Gi" if key in ("memory", "ephemeral-storage") else (f"{int(v * 1000)}m" if key == "cpu" else str(int(v)))


def committed(file: str) -> WorkflowSpec:
    return load_workflow_spec(next(d for d in yaml.safe_load_all((ARGO / file).read_text()) if d))


class PipelineCluster:
    def __init__(self, root: Path, runner_factory, revision: str) -> None:
        self.revision, self._closed = revision, False
        self.cluster = start_cluster(kubeconfig=root / "kubeconfig", nodes=overlay_nodes())
        # The steps' ServiceAccount holds only what the committed Roles grant (server.py Rbac): a verb the
        # pipeline calls and the Role lacks fails here as it would in the cluster.
        rbac = [d for d in yaml.safe_load_all((ARGO / "rbac.yaml").read_text()) if d]
        self.runner: PodRunner = runner_factory(kubeconfig=self.cluster.kubeconfig, hosts=self.cluster.hosts,
                                                tokens=self.cluster.enforce_rbac(rbac).tokens)
        self.work = root / "runs"

    @staticmethod
    def next_engine(**behaviour) -> None:
        """How the next engine the fake KubeRay starts behaves: first_token_delay, inter_token_delay,
        broken={...} (KnownTimingServer's switches). Then back to the default."""
        _NEXT_ENGINE.clear()
        _NEXT_ENGINE.update(behaviour)

    # ---- state ----

    def target(self) -> KubernetesTarget:
        return KubernetesTarget(NS, api_client=self.cluster.client("seed"), poll_s=0.05, restore_timeout_s=30)

    def seed(self, variant: str, promote: bool = True, spec_edit=None) -> ReleaseRecord:
        """A release of overlays/dev made by hand (as an earlier run would have), differing from the
        revision under test by one annotation; its spec recorded as rollout records it (steps.record_of),
        after `spec_edit(dict)` when given (the release was made from another release.yaml), or none
        with spec_edit=False (a release recorded before pdops kept specs)."""
        rendered = render(ROOT / "overlays" / ENV, validate_serve_config=False)
        objects = copy.deepcopy(rendered.objects)
        next(o for o in objects if o["kind"] == "RayService")["metadata"].setdefault("annotations", {})["test/variant"] = variant
        spec = rendered.spec.model_dump(mode="json")
        if spec_edit:
            spec_edit(spec)
        record = ReleaseRecord.of(dump_manifest(objects), name=RELEASE, model=rendered.spec.model.id,
                                  revision=variant * 40, spec=None if spec_edit is False else spec)
        target, say = self.target(), (lambda _line: None)
        with target.session():
            record = target.apply(record, say)
            target.wait_ready(60, say)
            return target.promote([f"seeded {variant}"], None, say) if promote else record

    def history(self) -> list[dict]:
        cm = self.cluster.objects("configmaps", NS).get(f"pdops-history-{RELEASE}")
        return json.loads(cm["data"]["history.json"]) if cm else []

    def stable_colour(self) -> str | None:
        svc = self.cluster.objects("services", NS).get(RELEASE)
        return (svc or {}).get("spec", {}).get("selector", {}).get("pdops.dev/colour")

    def rayservices(self) -> set[str]:
        return {n for n, o in self.cluster.objects("rayservices", NS).items() if not o["metadata"].get("deletionTimestamp")}

    # ---- runs ----

    def submit(self, file: str, parameters: dict[str, str], **kw) -> Run:
        """Run the committed workflow to its end. Holds the machine's measuring lock (tests/measure_lock.py):
        the run's validation gates on client health, which another tier measuring beside it would void."""
        params = {"environment": ENV, "revision": self.revision, **parameters}
        with measuring(f"{file} in {self.work.parent.name}"):
            return run_workflow(committed(file), self.runner, work=self.work, parameters=params,
                                generate_name=file.removesuffix(".yaml") + "-", repos={REPO_URL: ROOT}, **kw)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.cluster.close()
