"""Helpers for the Kubernetes target's tests on the test cluster (tests/fakes/kube)."""
from __future__ import annotations

import copy
import inspect
import json
import time

import pytest

from tests.conftest import ROOT
from tests.fakes.kube import start_cluster
from workflows.render.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord
from workflows.targets.kubernetes import KubernetesTarget

LOCAL_NS, DEV_NS = "pdops-local", "llm-dev"
KUBERAY_AGENT = "fake-kuberay"


@pytest.fixture(scope="module")
def manifests():
    """Rendered overlays (kustomize only: the serve config's Ray validation is not the target's concern)."""
    return {env: render(ROOT / "overlays" / env, validate_serve_config=False) for env in ("local", "dev")}


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    yield c
    c.close()


def record(manifests, env: str = "local", variant: str = "a", edit=None) -> ReleaseRecord:
    """A release of the overlay; variants differ by one annotation, so digests differ."""
    objects = copy.deepcopy(manifests[env].objects)
    rs = next(o for o in objects if o["kind"] == "RayService")
    rs["metadata"]["annotations"]["test/variant"] = variant
    if edit:
        edit(objects)
    return ReleaseRecord.of(dump_manifest(objects), name="pd-llm", model=manifests[env].spec.model.id, revision=variant * 40)


def target(cluster, namespace: str = LOCAL_NS, **kwargs) -> KubernetesTarget:
    kwargs.setdefault("poll_s", 0.05)
    kwargs.setdefault("restore_timeout_s", 30)
    kwargs.setdefault("drain_grace_s", 0.1)
    kwargs.setdefault("metrics_lag_s", 0.2)
    kwargs.setdefault("lease_s", 2.0)
    accepted = inspect.signature(KubernetesTarget).parameters  # so these tests also run against older targets
    return KubernetesTarget(namespace, api_client=cluster.client(), **{k: v for k, v in kwargs.items() if k in accepted})


class Lines(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def release(t: KubernetesTarget, rec: ReleaseRecord, progress=None) -> ReleaseRecord:
    progress = Lines() if progress is None else progress
    t.apply(rec, progress)
    t.wait_ready(30, progress)
    return t.promote(["gate: promote"], "reports/x.md", progress)


def eventually(condition, timeout_s: float = 30, what: str = "the test cluster did not get there"):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found


def history(cluster, ns: str = LOCAL_NS) -> list[dict]:
    return json.loads(cluster.objects("configmaps", ns)["pdops-history-pd-llm"]["data"]["history.json"])


def live(cluster, plural: str, ns: str = LOCAL_NS) -> dict[str, dict]:
    """Objects not being deleted."""
    return {n: o for n, o in cluster.objects(plural, ns).items() if not o["metadata"].get("deletionTimestamp")}


def selector(cluster, ns: str = LOCAL_NS) -> dict:
    return cluster.objects("services", ns)["pd-llm"]["spec"]["selector"]


def node(name: str, phase: str, gpus: int, cpu: str = "48", memory: str = "384Gi", **extra) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": "g6e.12xlarge", "pdops.dev/phase": phase,
                                                 "topology.kubernetes.io/zone": "us-east-1a"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": memory, "pods": "110", **extra},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def system_node(name: str = "system-1") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": "system"}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_nodes(per_phase: int, gpus: int = 4) -> list[dict]:
    """A system node and `per_phase` g6e.12xlarge-like nodes (4 GPUs, 48 CPU, 384 GiB) per phase (dev overlay)."""
    return [system_node()] + [node(f"{phase}-{i + 1}", phase, gpus) for phase in ("prefill", "decode") for i in range(per_phase)]
