"""Fixtures several unit test modules take: the test cluster (tests/kube_support.py, tests/fakes/kube) and its
cluster DNS. Here, pytest gives them to every module below; imported into each module, they were names the
test functions' arguments shadowed (ruff F811)."""
from __future__ import annotations

import socket

import pytest

from tests.fakes.diff_fake import DiffFake

# fixtures, for every module below (pytest finds them by name here)
from tests.fakes.kube import kube_cluster  # noqa: F401
from tests.kube_support import cluster, manifests  # noqa: F401


@pytest.fixture
def dns(cluster, monkeypatch):  # noqa: F811
    """`<svc>.<ns>.svc.cluster.local` resolves to the Service's clusterIP, as cluster DNS does."""
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".svc.cluster.local"):
            name, ns = host.split(".")[:2]
            svc = cluster.objects("services", ns).get(name)
            host = svc["spec"]["clusterIP"] if svc else host
        return real(host, port, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    cluster.kuberay.engine = {"server": DiffFake}
    return cluster


@pytest.fixture
def judged_after_the_reference(request, monkeypatch):
    """For modules that test the single-engine reference, golden tokens or the diff (`pytestmark =
    pytest.mark.usefixtures(...)`) with candidates that already fail elsewhere in their emulation (compat cases
    and loads with connection errors or one-token streams: not what those modules test): such a rollback is
    certain before a reference would start (workflows/pipeline/steps.py certain_rollback), so none would. Here the
    verdict is taken after the reference, as before that rule, except in a test whose name says
    `certain_rollback` (the rule's own)."""
    from workflows.pipeline import steps

    if "certain_rollback" not in request.node.name:
        monkeypatch.setattr(steps, "certain_rollback", lambda *a: None)
