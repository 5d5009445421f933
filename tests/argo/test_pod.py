"""The pod's image, securityContext, memory limit and ServiceAccount as pod.py applies them, on small templates.

Kubernetes semantics cited: the effective securityContext (pkg/securitycontext DetermineEffectiveSecurityContext),
the kubelet's runAsNonRoot check (pkg/kubelet/kuberuntime verifyRunAsNonRoot), the cgroup OOM kill reported as
`OOMKilled` with exit code 137 (the container runtime's reason, Argo's node message `main: OOMKilled`), RBAC
(plugin/pkg/auth/authorizer/rbac RuleAllows; the 403 worded as apiserver responsewriters forbiddenMessage).
"""
from __future__ import annotations

import json
import os
import shlex

import pytest
import yaml

from tests.argo.spec import WorkflowSpec
from tests.argo.workflow import run_workflow
from tests.conftest import ROOT
from tests.fakes.kube import start_cluster
from workflows.names import SERVICE_ACCOUNT, WORKFLOW_NAMESPACE

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


def spec(script: str, memory: str = "1Gi", pod_sc: str | None = None, cpu: str | None = None) -> WorkflowSpec:
    text = SECURE.format(script=json.dumps(script), memory=memory)
    if cpu is not None:
        text = text.replace("resources: {limits:", f"resources: {{requests: {{cpu: {cpu}}}, limits:")
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


@pytest.mark.parametrize("cpu, nice", [("1", -5), ("1500m", -5), ("250m", None), (None, None)])
def test_a_pod_requesting_a_whole_core_runs_at_the_guaranteed_weight(run, cpu, nice):
    """resources.requests.cpu of a core or more: CFS weight above the machine's other work (pod.py
    GUARANTEED_NICE, after kubelet MilliCPUToShares); the container still runs without CAP_SYS_NICE."""
    node, _, r = run(spec("nice > /tmp/out", cpu=cpu))
    assert node.phase == "Succeeded", r.describe()
    assert int(node.params["out"]) == (os.nice(0) if nice is None else nice), r.describe()   # None: the tier's own


def test_over_its_memory_limit_the_step_is_oom_killed(run):
    node, peak, r = run(spec('python3 -c "b = chr(120) * (400 * 2**20); import time; time.sleep(30)"', memory="200Mi"))
    assert node.phase == "Failed" and node.message == "main: OOMKilled (exit code 137)", r.describe()
    assert node.finished - node.started < 20 and peak > 200 * 2**20


def test_under_its_memory_limit_the_step_succeeds_and_its_peak_is_measured(run):
    node, peak, r = run(spec('python3 -c "b = chr(120) * (150 * 2**20); import time; time.sleep(1)"', memory="400Mi"))
    assert node.phase == "Succeeded", r.describe()
    assert 150 * 2**20 < peak < 400 * 2**20


CALLS = """
import json
from kubernetes import client, config
config.load_kube_config()
core, custom = client.CoreV1Api(), client.CustomObjectsApi()
out = {}
for what, call in [("list rayservices", lambda: custom.list_namespaced_custom_object("ray.io", "v1", "llm-dev",
                                                                                      "rayservices")),
                   ("list nodes", core.list_node),
                   ("delete a service", lambda: core.delete_namespaced_service("x", "llm-dev")),
                   ("list configmaps in pdops", lambda: core.list_namespaced_config_map("pdops"))]:
    try:
        call()
        out[what] = 200
    except client.ApiException as exc:
        out[what] = exc.status
        if what == "list nodes":
            out["message"] = json.loads(exc.body)["message"]
open("/tmp/out", "w").write(json.dumps(out))
"""


def test_the_service_account_holds_only_what_the_committed_role_grants(runner, argo_root):
    folder = argo_root / "rbac"   # not under /tmp: every pod mounts its emptyDir there
    folder.mkdir()
    cluster = start_cluster(kubeconfig=folder / "kubeconfig")
    try:
        rbac = [d for d in yaml.safe_load_all((ROOT / "kustomize" / "argo" / "rbac.yaml").read_text()) if d]
        s = spec(f"python3 -c {shlex.quote(CALLS)}").model_copy(update={"serviceAccountName": SERVICE_ACCOUNT})
        pods = runner(kubeconfig=cluster.kubeconfig, tokens=cluster.enforce_rbac(rbac).tokens)
        r = run_workflow(s, pods, work=folder / "wf", namespace=WORKFLOW_NAMESPACE)
        node = r.nodes[r.name]
        assert node.phase == "Succeeded", r.describe()
        got = json.loads(node.params["out"])
        assert got.pop("message") == ('nodes is forbidden: User "system:serviceaccount:pdops:pd-release" cannot list '
                                      'resource "nodes" in API group "" at the cluster scope')
        assert got == {"list rayservices": 200, "list nodes": 403, "delete a service": 403,
                       "list configmaps in pdops": 403}
        assert (f"system:serviceaccount:{WORKFLOW_NAMESPACE}:{SERVICE_ACCOUNT}", "delete", "services", "llm-dev") in \
            cluster.api.rbac.denied
    finally:
        cluster.close()


def test_the_memory_watcher_counts_a_vforked_child_once_and_a_forked_one_fully():
    """The pod runner's memory limit sums its process tree's RSS (tests/argo/pod.py _tree_rss). CPython starts a
    subprocess by vfork, and until its exec the child's /proc statm shows the parent's pages: counted twice, a
    check step of 690 MiB running kustomize read 1385 MiB and was killed over its 1 GiB limit (CI run 20 of
    2026-12-07), which the kernel's cgroup (a page counted once) would not do. Emulated: memory.max by a sampler;
    real: the processes, vfork and kcmp(2)."""
    import subprocess
    import sys
    import threading

    from tests.argo.pod import _tree_rss

    script = """
import subprocess, sys
held = bytearray(300 * 2**20)
for i in range(0, len(held), 4096): held[i] = 1
print("ready", flush=True)
sys.stdin.readline()
for _ in range(400): subprocess.run(["true"])
print("spawned", flush=True)
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", "b = bytearray(100 * 2**20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nprint('x', flush=True)\\ninput()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("child", flush=True)
sys.stdin.readline()
child.communicate("\\n")
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        own = _tree_rss(parent.pid)
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(_tree_rss(parent.pid))
        sampler = threading.Thread(target=sample)
        sampler.start()
        parent.stdin.write("\n"); parent.stdin.flush()
        assert parent.stdout.readline().strip() == "spawned"
        stop.set(); sampler.join()
        assert len(samples) > 100 and own > 300 * 2**20
        assert max(samples) < own + 50 * 2**20, (own, max(samples))
        parent.stdin.write("\n"); parent.stdin.flush()
        assert parent.stdout.readline().strip() == "child"
        assert _tree_rss(parent.pid) > own + 90 * 2**20   # a forked child's own pages still count
        parent.stdin.write("\n"); parent.stdin.flush()
    finally:
        parent.kill()
        parent.wait()
