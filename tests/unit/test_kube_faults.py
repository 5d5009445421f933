"""Fault twins of the local stack's tests, on the test cluster."""
from __future__ import annotations

import pytest
from kubernetes import client

from tests.kube_support import LOCAL_NS, Lines, eventually, history, live, record, release, selector, target
from workflows.pipeline.steps import replaced_engines
from workflows.targets.base import TargetError


def test_an_engine_pod_killed_during_validation_is_seen_as_a_replaced_engine(cluster, manifests):
    """The twin of `engines_stable` on the local stack: KubeRay replaces a deleted worker pod (new pod,
    new engine replica); the candidate's endpoint read after validation names what was replaced."""
    t = target(cluster)
    t.apply(record(manifests), Lines())
    before = t.wait_ready(30, Lines())
    assert set(before.metrics_phases) == {"prefill", "decode"}
    prefill = next(n for n, p in live(cluster, "pods").items() if p["metadata"]["labels"].get("pdops.dev/phase") == "prefill")
    client.CoreV1Api(cluster.client("chaos")).delete_namespaced_pod(prefill, LOCAL_NS)
    after = eventually(lambda: (e := t.endpoint("candidate")).metrics_phases.get("prefill") and
                       e.metrics_phases["prefill"] != before.metrics_phases["prefill"] and e)
    replaced = replaced_engines(before, after)
    assert replaced and replaced[0].startswith("prefill ") and "replaced by prefill-" in replaced[0]
    assert replaced_engines(before, before) == []


def test_a_conflict_while_recording_the_promote_changes_nothing_and_the_next_run_finishes_it(cluster, manifests):
    """409 on the history write of promote (another writer changed it). Users move first (slots.py): they
    are on the validated candidate, both colours serve, the candidate is still pending, and the retry
    completes the record and retires the old colour."""
    t = target(cluster)
    release(t, record(manifests, variant="a"))
    t.apply(record(manifests, variant="b"), Lines())
    t.wait_ready(30, Lines())
    def conflict(request):
        from tests.fakes.kube.store import ApiError
        if request.method == "PATCH" and "/configmaps/" in request.path and request.agent == "pdops-test":
            cluster.faults.before_write.remove(conflict)
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on configmaps "pdops-history-pd-llm": '
                           "the object has been modified; please apply your changes to the latest version and try again")
    cluster.faults.before_write.append(conflict)
    with pytest.raises(TargetError, match="409"):
        t.promote(["gate: promote"], None, Lines())
    assert selector(cluster)["pdops.dev/colour"] == "green"
    assert set(live(cluster, "rayservices")) == {"pd-llm-blue", "pd-llm-green"}
    assert target(cluster).status().candidate.release.revision.startswith("b")  # still pending: nothing recorded
    target(cluster).promote(["gate: promote"], None, Lines())
    assert selector(cluster)["pdops.dev/colour"] == "green" and set(live(cluster, "rayservices")) == {"pd-llm-green"}
    assert [(r["revision"][0], r["verdict"]) for r in history(cluster)] == [("a", "promote"), ("b", "promote")]


def test_pdops_steps_run_as_subprocesses_against_the_cluster_through_its_kubeconfig(cluster, manifests):
    """What the Argo execution tier does: `pdops <step>` in its own process with KUBECONFIG set."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    release(target(cluster), record(manifests))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONPATH": str(ROOT)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run([sys.executable, "-m", "workflows.cli.main", "status", "--target", "kubernetes", "--namespace", LOCAL_NS, "--json"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["stable"]["state"] == "ready" and status["stable"]["release"]["colour"] == "blue"
