"""The pod's securityContext and memory limit as pod.py applies them, on small hand-written templates.

Kubernetes semantics cited: the effective securityContext (pkg/securitycontext DetermineEffectiveSecurityContext),
the kubelet's runAsNonRoot check (pkg/kubelet/kuberuntime verifyRunAsNonRoot), the cgroup OOM kill reported as
`OOMKilled` with exit code 137 (the container runtime's reason, Argo's node message `main: OOMKilled`).
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.argo.spec import WorkflowSpec
from tests.argo.workflow import run_workflow

SECURE = """
securityContext: {{runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}}
entrypoint: main
volumes: [{{name: tmp, emptyDir: {{}}}}]
templates:
- name: main
  container:
    image: step
    command: [sh, -c]
    args: [{script}]
    volumeMounts: [{{name: tmp, mountPath: /tmp}}]
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, runAsNonRoot: true,
                      capabilities: {{drop: [ALL]}}}}
    resources: {{limits: {{memory: {memory}}}}}
  outputs:
    parameters: [{{name: out, valueFrom: {{path: /tmp/out, default: none}}}}]
"""


def spec(script: str, memory: str = "1Gi", pod_sc: str | None = None) -> WorkflowSpec:
    text = SECURE.format(script=json.dumps(script), memory=memory)
    if pod_sc is not None:
        text = text.replace(text.splitlines()[1], f"securityContext: {pod_sc}")
    return WorkflowSpec.model_validate(yaml.safe_load(text))


@pytest.fixture
def run(runner, argo_root):
    """(the workflow's entry node, its pod's peak RSS in bytes, the run)."""
    def go(s: WorkflowSpec):
        pods = runner()
        r = run_workflow(s, pods, work=argo_root / "limits")
        return r.nodes[r.name], pods.peaks.get("main", 0), r
    return go


def test_the_step_runs_as_its_user_with_a_read_only_root_and_writable_volumes(run):
    node, _, r = run(spec('w=$(touch /var/tmp/pdops-ro-probe 2>&1 || :); rm -f /var/tmp/pdops-ro-probe; '
                          'touch /tmp/home-is-writable; '
                          'echo "$(id -u);$(id -g);$(id -G);$w;$(grep -E \'^(NoNewPrivs|CapBnd)\' /proc/self/status'
                          ' | tr -d \'\\t \' | tr \'\\n\' \' \')" > /tmp/out'))
    assert node.phase == "Succeeded", r.describe()
    uid, gid, groups, write, status = node.params["out"].split(";")
    assert (uid, gid, set(groups.split())) == ("10001", "10001", {"10001"}), node.params   # fsGroup: a supplementary group
    assert "Read-only file system" in write, write
    assert sorted(status.split()) == ["CapBnd:0000000000000000", "NoNewPrivs:1"], status


def test_the_image_and_its_user_run_pdops_from_the_step_venv(run):
    node, _, r = run(spec('command -v pdops > /tmp/out; command -v kubectl >> /tmp/out; pdops --help >/dev/null; '
                          'python3 -c "import workflows; print(workflows.__file__)" >> /tmp/out'))
    assert node.phase == "Succeeded", r.describe()
    pdops, kubectl, package = node.params["out"].splitlines()
    assert pdops == "/opt/pdops/venv/bin/pdops" and kubectl == "/opt/pdops/venv/bin/kubectl"
    assert package.startswith("/opt/pdops/venv/lib/") and "site-packages/workflows" in package


def test_run_as_non_root_refuses_root(run):
    node, _, r = run(spec("true", pod_sc="{runAsNonRoot: true, runAsUser: 0}"))
    assert node.phase == "Error" and "runAsNonRoot" in node.message, r.describe()


def test_over_its_memory_limit_the_step_is_oom_killed(run):
    node, peak, r = run(spec('python3 -c "b = chr(120) * (400 * 2**20); import time; time.sleep(30)"', memory="200Mi"))
    assert node.phase == "Failed" and node.message == "main: OOMKilled (exit code 137)", r.describe()
    assert node.finished - node.started < 20 and peak > 200 * 2**20


def test_under_its_memory_limit_the_step_succeeds_and_its_peak_is_measured(run):
    node, peak, r = run(spec('python3 -c "b = chr(120) * (150 * 2**20); import time; time.sleep(1)"', memory="400Mi"))
    assert node.phase == "Succeeded", r.describe()
    assert 150 * 2**20 < peak < 400 * 2**20
