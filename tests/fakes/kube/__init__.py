"""A test Kubernetes cluster on 127.0.0.0/8: an API server with the semantics pdops relies on, a fake
KubeRay v1.7 operator, and pod/Service networking with real Serve proxies and Ray metrics agents.

Use it from a test (fixture) or from any process (a plain function; it writes a kubeconfig, so
subprocesses such as `pdops` steps run by the Argo execution tier can use it with KUBECONFIG):

    from tests.fakes.kube import start_cluster
    cluster = start_cluster(kubeconfig="/tmp/kubeconfig")   # or None: a temporary file
    cluster.kubeconfig          # Path; export KUBECONFIG=... for subprocesses
    cluster.url                 # http://127.0.0.1:PORT (no auth; the token is ignored, but see below)
    cluster.enforce_rbac(roles_and_bindings).tokens["pod:x"] = "system:serviceaccount:pdops:pd-release"
                                # that token is then that ServiceAccount, authorized by RBAC (server.py Rbac)
    cluster.kuberay.behaviour["green"] = "fail"     # ok | fail | stuck | invalid | head_unhealthy
    cluster.hosts()             # "<clusterIP> pd-llm-blue-serve-svc.llm-dev.svc.cluster.local ...\n" for /etc/hosts
    cluster.resolve(url)        # a *.svc.cluster.local URL with the Service's clusterIP
    cluster.objects("rayservices", "llm-dev"); cluster.writes(agent); cluster.faults.failing = {"services": 1}
    cluster.close()

    # pytest: `from tests.fakes.kube import kube_cluster` and take `kube_cluster` as an argument.
    # Standalone: `python -m tests.fakes.kube --kubeconfig /tmp/kubeconfig` serves until killed.

Namespaces pdops, pdops-local, llm-dev, llm-staging, llm-prod and default exist. Each pod the fake
KubeRay starts has its own 127.x.y.z address with the Serve proxy on :8000 and Ray's metrics agent
on :8080 (engines' `ray_vllm_*` series on worker pods only); Services get clusterIPs in 127/8 with
kube-proxy-like forwarding to ready endpoints. See store.py, apply.py, server.py, kuberay.py,
network.py, engine.py for what each models and the upstream code it follows.
"""
from __future__ import annotations

import pytest

from tests.fakes.kube.cluster import DEFAULT_NAMESPACES, TestCluster, start_cluster

__all__ = ["DEFAULT_NAMESPACES", "TestCluster", "kube_cluster", "start_cluster"]


@pytest.fixture
def kube_cluster(tmp_path):
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    yield cluster
    cluster.close()
