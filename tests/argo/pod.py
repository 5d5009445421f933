"""One step of a workflow run as a process on this machine, with the container's paths.

What a pod is here (as root, in a private mount namespace: `unshare -m`):
- each `volumeMounts` entry is a host directory bind-mounted at its mountPath (an emptyDir per pod,
  fresh and empty, so `/tmp` is the pod's own); an input artifact is placed where Argo's init
  container puts it (workflow/executor/executor.go `loadArtifacts`): inside the volume that covers
  its path, else on a bind mount of its own (the git checkout at /workspace/src);
- /etc/hosts maps the cluster's `*.svc.cluster.local` names to loopback addresses (cluster DNS), kept
  up to date while the pod runs;
- the image is the Dockerfile's ENV and ENTRYPOINT with the pdops code of the image's revision on
  PYTHONPATH (a `git archive` of it outside the pod's view), run by the test venv's Python; `pdops`
  and `kubectl` are on PATH; KUBECONFIG points at the emulated API server and stands in for the
  pod's ServiceAccount token (no RBAC is enforced): a kubeconfig of the pod's own whose token is
  `pod:<pod name>`, as a bound token names its pod to the API server, whose write log
  (tests/fakes/kube/server.py) so says which pod, and which workflow, wrote what;
- deadlines: the process group gets SIGTERM at the step's deadline and SIGKILL after GRACE_S (the
  kubelet's activeDeadlineSeconds, or the executor's ARGO_DEADLINE monitor, executor.go
  `monitorDeadline`); a fault can kill it too (as an OOM kill or node loss would);
- outputs are read after the process ends whatever its exit code, as the wait container does
  (cmd/argoexec/commands/wait.go: SaveParameters, SaveArtifacts); a missing file without a default
  is an error of the wait container.
Not emulated: image pulls, the securityContext (runs as root; root filesystem writable), resources.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

GRACE_S = 2.0  # terminationGracePeriodSeconds is 30 s in a cluster; the steps here stop well within 2 s


@dataclass
class PodSpec:
    name: str
    command: list[str]
    env: dict[str, str]
    working_dir: str | None
    mounts: dict[str, Path]                    # container path -> host dir (volumes)
    inputs: dict[str, Path]                    # container path -> host file/dir to place there
    out_params: list[tuple[str, str, str | None]]   # name, path, default
    out_artifacts: list[tuple[str, str, bool]]      # name, path, optional
    deadline_s: float | None
    deadline_message: str = "Pod was active on the node longer than the specified deadline"


@dataclass
class PodResult:
    exit_code: int | None
    phase: str
    message: str
    params: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
    log: str = ""
    seconds: float = 0.0


BASE_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}  # python:3.11-slim


def dockerfile_image(dockerfile: Path) -> tuple[dict[str, str], list[str]]:
    """ENV and ENTRYPOINT of the step image, read from the Dockerfile so the two cannot drift; `$VAR`
    in an ENV value is the value so far (Docker's ENV substitution), starting from the base image's."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = dict(BASE_IMAGE_ENV)
    entrypoint: list[str] = []
    for line in text.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, _, value = item.partition("=")
                env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
        elif line.startswith("ENTRYPOINT "):
            entrypoint = __import__("json").loads(line[len("ENTRYPOINT "):])
    return env, entrypoint


class PodRunner:
    def __init__(self, root: Path, *, python: str, image_src: Path, kubeconfig: Path | None,
                 hosts: dict[str, str] | Callable[[], str], schema_dir: Path, dockerfile: Path) -> None:
        """`hosts`: name -> address, or a function giving /etc/hosts lines, called as each pod starts
        (a Service created by an earlier step is resolvable by the next)."""
        self.root = root
        self.image_env, self.entrypoint = dockerfile_image(dockerfile)
        self.image_src, self.kubeconfig, self.schema_dir = image_src, kubeconfig, schema_dir
        self.bin = root / "image-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.bin / "pdops").write_text(f"#!/bin/sh\nexec {shlex.quote(python)} -P -m workflows.cli.main \"$@\"\n")
        (self.bin / "pdops").chmod(0o755)
        kubectl = Path(python).parent / "kubectl"
        if kubectl.exists() and not (self.bin / "kubectl").exists():
            (self.bin / "kubectl").symlink_to(kubectl)
        self.hosts = hosts
        self._seq = 0
        self._lock = threading.Lock()

    def _hosts_file(self, d: Path) -> Path:
        lines = "127.0.0.1 localhost\n"
        lines += self.hosts() if callable(self.hosts) else "".join(f"{ip} {n}\n" for n, ip in sorted(self.hosts.items()))
        path = d / "hosts"
        if not path.exists():
            path.write_text(lines)
        elif path.read_text() != lines:   # in place (the pod's bind mount keeps this inode), never empty
            with open(path, "r+") as f:
                f.write(lines)
                f.truncate(len(lines.encode()))
        return path

    def _refresh_hosts(self, d: Path, proc: subprocess.Popen) -> None:
        """Cluster DNS answers for Services created while the pod runs (a step that creates a
        RayService reaches its `<rs>-serve-svc`, e.g. the single-engine reference): glibc reads
        /etc/hosts on every lookup, so the pod sees the rewritten file."""
        while proc.poll() is None and callable(self.hosts):
            time.sleep(0.2)
            self._hosts_file(d)

    def _pod_dir(self, name: str) -> Path:
        with self._lock:
            self._seq += 1
            d = self.root / "pods" / f"{self._seq:03d}-{re.sub(r'[^A-Za-z0-9.-]', '_', name)}"
        d.mkdir(parents=True)
        return d

    def env(self, pod: PodSpec, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {"HOSTNAME": pod.name[:63], **self.image_env}
        env["PATH"] = f"{self.bin}:{env['PATH']}"  # `pdops` and `kubectl` of the image, standing in for its venv
        env["PYTHONPATH"] = str(self.image_src)  # the pdops installed in the image (its revision)
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)  # stands in for the ServiceAccount token
        env.update(pod.env)
        return env

    def run(self, pod: PodSpec, kill: threading.Event | None = None) -> PodResult:
        d = self._pod_dir(pod.name)
        host_of: dict[str, Path] = {}  # container mount point -> host path
        for path, src in pod.mounts.items():
            host_of[path] = src
        if self.image_env.get("PDOPS_SCHEMA_DIR") == "/opt/pdops/schemas" and self.schema_dir.is_dir():
            host_of["/opt/pdops/schemas"] = self.schema_dir  # COPY --from=schemas in the Dockerfile
        for path, src in pod.inputs.items():  # the init container's artifact loading
            volume = _covering(path, pod.mounts)
            if volume is not None:
                dest = pod.mounts[volume] / os.path.relpath(path, volume)
                dest.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy)(src, dest)
            else:
                host_of[path] = src
        script = ["set -e", "mount --make-rprivate /"]
        for path in sorted(host_of, key=len):
            Path(path).mkdir(parents=True, exist_ok=True) if host_of[path].is_dir() else None
            script.append(f"mount --bind {shlex.quote(str(host_of[path]))} {shlex.quote(path)}")
        script.append(f"mount --bind {shlex.quote(str(self._hosts_file(d)))} /etc/hosts")
        script.append(f'cd {shlex.quote(pod.working_dir or "/")}')
        script.append('exec "$@"')
        log_path = d / "log"
        env = self.env(pod, _pod_kubeconfig(self.kubeconfig, pod.name, d))
        started = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["unshare", "-m", "sh", "-c", "\n".join(script), "pod", *pod.command],
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            threading.Thread(target=self._refresh_hosts, args=(d, proc), daemon=True).start()
            killed = _watch(proc, pod.deadline_s, kill)
        seconds = time.monotonic() - started
        log_text = log_path.read_text(errors="replace")
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # a signal, as the runtime reports it
        if killed == "deadline":
            phase, message = "Failed", pod.deadline_message
        elif killed == "fault":
            phase, message = "Failed", f"main: OOMKilled (exit code {code if code is not None else 137})"
        elif code == 0:
            phase, message = "Succeeded", ""
        else:
            phase, message = "Failed", f"main: Error (exit code {code})"
        result = PodResult(code, phase, message, log=log_text, seconds=seconds)
        self._collect(pod, result, d)
        (d / "result").write_text(f"{result.phase} exit={code} {seconds:.1f}s {result.message}\n")
        return result

    def _collect(self, pod: PodSpec, result: PodResult, d: Path) -> None:
        """wait.go: SaveParameters then SaveArtifacts, errors added to the wait container's."""
        errors = []
        for name, path, default in pod.out_params:
            host = _host_path(path, pod.mounts)
            if host is not None and host.is_file():
                result.params[name] = host.read_text().removesuffix("\n")  # "Trims off a single newline"
            elif default is not None:
                result.params[name] = default
            else:
                errors.append(f"open {path}: no such file or directory")
        for name, path, optional in pod.out_artifacts:
            host = _host_path(path, pod.mounts)
            if host is None or not host.exists():
                if not optional:
                    errors.append(f"path {path} does not exist in archive")
                continue
            dest = d / "out" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if host.is_dir() else shutil.copy)(host, dest)
            result.artifacts[name] = dest
        if errors and result.phase == "Succeeded":  # inferFailedReason: main first, then wait
            result.phase, result.message = "Error", "wait: Error (exit code 1): " + "; ".join(errors)


def _pod_kubeconfig(kubeconfig: Path | None, pod: str, d: Path) -> Path | None:
    """The cluster's kubeconfig with the pod's own token (`pod:<name>`): the projected ServiceAccount
    token the kubelet mounts is bound to its pod, and the API server knows the pod by it."""
    if kubeconfig is None or not kubeconfig.is_file():
        return kubeconfig
    config = yaml.safe_load(kubeconfig.read_text())
    for user in config.get("users") or []:
        user.setdefault("user", {})["token"] = f"pod:{pod}"
    path = d / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _covering(path: str, mounts: dict[str, Path]) -> str | None:
    best = None
    for mount in mounts:
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            best = mount if best is None or len(mount) > len(best) else best
    return best


def _host_path(path: str, mounts: dict[str, Path]) -> Path | None:
    """Where a container path lives on the host: only inside a volume (the wait container reads
    volumes; the base image layer is not emulated)."""
    volume = _covering(path, mounts)
    if volume is None:
        return None
    return mounts[volume] / os.path.relpath(path, volume)


def _watch(proc: subprocess.Popen, deadline_s: float | None, kill: threading.Event | None) -> str | None:
    start = time.monotonic()
    while proc.poll() is None:
        reason = None
        if deadline_s is not None and time.monotonic() - start >= deadline_s:
            reason = "deadline"
        elif kill is not None and kill.is_set():
            reason = "fault"
        if reason:
            _stop(proc, signal.SIGTERM if reason == "deadline" else signal.SIGKILL)
            return reason
        time.sleep(0.05)
    return None


def _stop(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
