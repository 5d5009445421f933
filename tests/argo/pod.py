"""One step of a workflow run as a process on this machine, with the container's paths.

What a pod is here (set up as root in a private mount namespace, `unshare -m`, then run as the pod's user):
- each `volumeMounts` entry is a host directory bind-mounted at its mountPath (an emptyDir per pod,
  fresh and empty, mode 0777 as the kubelet makes it, group fsGroup with setgid when the pod sets one:
  pkg/volume/emptydir/empty_dir.go, pkg/volume/volume_linux.go SetVolumeOwnership, so `/tmp` is the
  pod's own); an input artifact is placed where Argo's init container puts it (workflow/executor/
  executor.go `loadArtifacts`): inside the volume that covers its path, else on a bind mount of its own
  (the git checkout at /workspace/src), owned by the pod's user as the init container (same pod
  securityContext) leaves it;
- /etc/hosts maps the cluster's `*.svc.cluster.local` names to loopback addresses (cluster DNS), kept
  up to date while the pod runs;
- the image: the Dockerfile's ENV, ENTRYPOINT and USER, and its install: the step venv that
  tests/step_venv.py builds with the Dockerfile's own install line (`bash scripts/setup.sh` with its
  PDOPS_SETUP_* settings: vllm, ray and the project of the revision under test, non-editable), mounted
  read-only at the image's PDOPS_VENV (/opt/pdops/venv), so `pdops` and `kubectl` are the image's, first on
  the image's PATH; the venv's interpreter is the base Python it was made from (the image's
  python:3.11-slim is not replayed: tests/unit/test_step_image.py says what that leaves out);
- the securityContext (pod's, then the container's over it: pkg/securitycontext DetermineEffectiveSecurityContext):
  runAsUser/runAsGroup (else the Dockerfile's USER), fsGroup as a supplementary group, runAsNonRoot (a
  root user fails the pod: kubelet kuberuntime verifyRunAsNonRoot), capabilities drop ALL (empty bounding
  and inheritable sets), allowPrivilegeEscalation false (no_new_privs), readOnlyRootFilesystem (this
  machine's mounts are read-only in the pod's namespace; volumes and /dev/shm stay writable). A host
  folder the user could not enter (e.g. /root, 0700, holding the base Python and the venv cache; the
  tier's 0700 temp folder holding the kubeconfig) is covered, in the pod's namespace only, by a folder
  that holds just what the pod needs from it;
- resources.limits.memory: a watcher sums the resident memory (RSS) of the pod's process tree every
  MEMORY_SAMPLE_S and SIGKILLs the process group when it is over the limit: `OOMKilled`, exit 137, as the
  kernel's cgroup OOM killer and the kubelet report it (the whole container goes: memory.oom.group, set by
  the kubelet on cgroup v2 since Kubernetes 1.28). It differs from memory.max: page cache, tmpfs and
  kernel memory are not counted (the cgroup charges them); a page shared by forked processes is counted
  once per process (the cgroup charges it once); a peak shorter than the sampling interval is missed; a
  process that leaves the tree (double fork) is not counted. Each pod's peak is in its `result` file and in
  PodRunner.peaks (printed at the end of the tier);
- KUBECONFIG points at the emulated API server and stands in for the pod's ServiceAccount token: a
  kubeconfig of the pod's own whose token is `pod:<pod name>`, as a bound token names its pod to the API
  server, whose write log (tests/fakes/kube/server.py) so says which pod, and which workflow, wrote what;
  with `tokens` (the emulated API server's Rbac.tokens, as the pipeline's test cluster enforces RBAC) that
  token is entered as the pod's serviceAccountName, so the API server authorizes the pod's requests against
  the committed Roles and RoleBindings (kustomize/argo/rbac.yaml, from workflows/argo/rbac.py): a verb the
  Role lacks is answered 403 Forbidden, as in a cluster;
- deadlines: the process group gets SIGTERM at the step's deadline and SIGKILL after GRACE_S (the
  kubelet's activeDeadlineSeconds, or the executor's ARGO_DEADLINE monitor, executor.go
  `monitorDeadline`); a fault can kill it too (as an OOM kill or node loss would);
- outputs are read after the process ends whatever its exit code, as the wait container does
  (cmd/argoexec/commands/wait.go: SaveParameters, SaveArtifacts); a missing file without a default
  is an error of the wait container.
Not emulated: image pulls and the base image's filesystem (the pod sees this machine's, read-only), the
executor's own RBAC (pd-release-executor: no wait container writes workflowtaskresults here), ClusterRoles,
seccomp (RuntimeDefault), CPU limits (a CPU request of a core or more is a higher CFS weight: GUARANTEED_NICE),
emptyDir sizeLimit, the network (the pod shares the machine's).
"""
from __future__ import annotations

import ctypes
import os
import platform
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
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from tests.dockerfile import dockerfile_image

GRACE_S = 2.0  # terminationGracePeriodSeconds is 30 s in a cluster; the steps here stop well within 2 s
MEMORY_SAMPLE_S = 0.1
def memory_bytes(quantity: str | int | None) -> int | None:
    """A Kubernetes memory quantity in bytes, parsed by the official client (kubernetes.utils.parse_quantity,
    apimachinery resource.Quantity's suffixes), as workflows/targets/kube/capacity.py parses them."""
    return None if quantity is None else int(parse_quantity(quantity))


def cpu_cores(quantity: str | int | None) -> float | None:
    """A Kubernetes CPU quantity in cores (`250m` -> 0.25), by the official client's parser."""
    return None if quantity is None else float(parse_quantity(quantity))


# resources.requests.cpu: under contention the kubelet guarantees a pod its request (cgroup cpu.shares of
# request x 1024 per core: kubernetes pkg/kubelet/cm/helpers_linux.go MilliCPUToShares), because the node's
# other work runs in cgroups of its own requests. Here the node's other work is whatever else runs on this
# machine at nice 0 (another test tier), so a pod requesting a whole core or more runs at GUARANTEED_NICE:
# CFS weight 3121 against 1024, about three quarters of two contended cores, near the one core of two it
# asked for. Smaller requests (the 250m steps) keep nice 0. Why it matters: validate's client is gated on its
# own health (event-loop lag p99 <= 10 ms, overlays/dev); at nice 0 beside the unit tier it measured 13.5 ms
# once (clean-clone CI, 2026-12-07) and the release was rolled back as void.
GUARANTEED_NICE = -5


@dataclass
class Security:
    """The effective securityContext of the pod's container (None: the image's USER)."""
    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None
    run_as_non_root: bool = False
    read_only_root: bool = False
    no_new_privs: bool = False
    drop_all_caps: bool = False

    @classmethod
    def of(cls, pod: dict[str, Any] | None, container: dict[str, Any] | None) -> Security:
        """The container's fields over the pod's (DetermineEffectiveSecurityContext)."""
        pod, container = pod or {}, container or {}
        both = {**{k: v for k, v in pod.items() if k in ("runAsUser", "runAsGroup", "runAsNonRoot")}, **container}
        return cls(run_as_user=both.get("runAsUser"), run_as_group=both.get("runAsGroup"),
                   fs_group=pod.get("fsGroup"), run_as_non_root=bool(both.get("runAsNonRoot")),
                   read_only_root=bool(container.get("readOnlyRootFilesystem")),
                   no_new_privs=container.get("allowPrivilegeEscalation") is False,
                   drop_all_caps="ALL" in ((container.get("capabilities") or {}).get("drop") or []))


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
    template: str = ""
    security: Security = field(default_factory=Security)
    memory_limit: int | None = None            # bytes: resources.limits.memory
    cpu_request: float | None = None           # cores: resources.requests.cpu (GUARANTEED_NICE says what it does)
    service_account: str | None = None         # system:serviceaccount:<workflow namespace>:<serviceAccountName>


@dataclass
class PodResult:
    exit_code: int | None
    phase: str
    message: str
    params: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
    log: str = ""
    seconds: float = 0.0
    peak_rss: int = 0                           # bytes, the watcher's largest sample


def dockerfile_user(dockerfile: Path) -> tuple[int, int]:
    """The image's USER as uid, gid (numeric in the step image's Dockerfile; root when it sets none)."""
    user = "0:0"
    for line in dockerfile.read_text().splitlines():
        if line.startswith("USER "):
            user = line[5:].strip()
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


class PodRunner:
    def __init__(self, root: Path, *, venv: Path, kubeconfig: Path | None,
                 hosts: dict[str, str] | Callable[[], str], dockerfile: Path,
                 tokens: dict[str, str] | None = None) -> None:
        """`venv`: the step image's install (tests/step_venv.py), mounted at the image's PDOPS_VENV.
        `hosts`: name -> address, or a function giving /etc/hosts lines, called as each pod starts
        (a Service created by an earlier step is resolvable by the next). `tokens`: the API server's
        token -> ServiceAccount table (TestCluster.enforce_rbac), where a pod with a serviceAccountName enters
        its own token as it starts; None: no RBAC."""
        self.root = root
        self.image_env, self.entrypoint = dockerfile_image(dockerfile)
        self.image_user = dockerfile_user(dockerfile)
        self.venv, self.kubeconfig, self.tokens = venv, kubeconfig, tokens
        home = next((ln.split("=", 1)[1].strip() for ln in (venv / "pyvenv.cfg").read_text().splitlines()
                     if ln.split("=", 1)[0].strip() == "home"), None)
        self.base_python = Path(home).parent if home else None   # the venv's interpreter lives there
        self.host_mounts = _host_mounts()
        self.hosts = hosts
        self.peaks: dict[str, int] = {}   # template -> largest peak RSS of its pods (bytes)
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
            # 20 ms, not 0.2 s: a step that sees a new RayService ready can call its Service within 0.25 s (the
            # waits' first look, targets/polling.py), and a stale file then fails the lookup, as CoreDNS (which
            # serves a Service as soon as its watch delivers it) would not: the golden-token requests of an Argo
            # run to the new reference failed so once (CI, 2026-12-07). hosts() is cached per store revision.
            time.sleep(0.02)
            try:
                self._hosts_file(d)
            except FileNotFoundError:   # the pod ended meanwhile and its folder was removed
                return

    def _pod_dir(self, name: str) -> Path:
        with self._lock:
            self._seq += 1
            d = self.root / "pods" / f"{self._seq:03d}-{re.sub(r'[^A-Za-z0-9.-]', '_', name)}"
        d.mkdir(parents=True)
        return d

    def env(self, pod: PodSpec, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {"HOSTNAME": pod.name[:63], **self.image_env}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)  # stands in for the ServiceAccount token
        env.update(pod.env)
        return env

    def user(self, pod: PodSpec) -> tuple[int, int]:
        uid, gid = self.image_user
        sc = pod.security
        return (uid if sc.run_as_user is None else sc.run_as_user,
                gid if sc.run_as_group is None else sc.run_as_group)

    def run(self, pod: PodSpec, kill: threading.Event | None = None) -> PodResult:
        d = self._pod_dir(pod.name)
        uid, gid = self.user(pod)
        if pod.security.run_as_non_root and uid == 0:
            result = PodResult(None, "Error", "main: CreateContainerConfigError: container has runAsNonRoot and "
                               "image will run as root")
            (d / "result").write_text(f"{result.phase} {result.message}\n")
            return result
        groups = [pod.security.fs_group] if pod.security.fs_group is not None else []
        host_of: dict[str, Path] = {}  # container mount point -> host path
        for path, src in pod.mounts.items():
            host_of[path] = src
            src.chmod(0o777)   # the kubelet's emptyDir
            if pod.security.fs_group is not None:
                os.chown(src, -1, pod.security.fs_group)
                src.chmod(0o2777)
        host_of[self.image_env.get("PDOPS_VENV", "/opt/pdops/venv")] = self.venv
        for path, src in pod.inputs.items():  # the init container's artifact loading
            volume = _covering(path, pod.mounts)
            if volume is not None:
                dest = pod.mounts[volume] / os.path.relpath(path, volume)
                dest.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy)(src, dest)
                _chown_tree(dest, uid, gid)
            else:
                host_of[path] = src
                _chown_tree(src, uid, gid)   # a checkout shared by the run's pods, all of one user
        kubeconfig = _pod_kubeconfig(self.kubeconfig, pod.name, d)
        if kubeconfig is not None and self.tokens is not None and pod.service_account:
            self.tokens[f"pod:{pod.name}"] = pod.service_account   # the bound token's ServiceAccount
        script = ["set -e", "mount --make-rprivate /"]
        needed = [p for p in (self.venv, self.base_python, kubeconfig) if p is not None]
        covers, binds = _covers(needed, uid, [gid, *groups], d / "covers")
        for path, inner in binds:   # first: a volume mounted next may hide the path
            script.append(f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(inner))}")
        for path in sorted(host_of, key=len):
            Path(path).mkdir(parents=True, exist_ok=True) if host_of[path].is_dir() else None
            script.append(f"mount --bind {shlex.quote(str(host_of[path]))} {shlex.quote(path)}")
        script.append(f"mount --bind {shlex.quote(str(self._hosts_file(d)))} /etc/hosts")
        for folder, skeleton in covers:
            script.append(f"mount --rbind {shlex.quote(str(skeleton))} {shlex.quote(str(folder))}")
        if pod.security.read_only_root:
            for mp in self.host_mounts:   # this machine's filesystems; the pod's own mounts are above them
                script.append(f"mount -o remount,bind,ro {shlex.quote(mp)}" + ("" if mp == "/" else " || :"))
            image = [p for p in host_of if host_of[p] == self.venv]   # the image's files, read-only too
            for path in [*image, *(str(f) for f, _ in covers), *(str(p) for p, _ in binds)]:
                script.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
        script.append(f'cd {shlex.quote(pod.working_dir or "/")}')
        user = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
                f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"]
        if pod.security.no_new_privs:
            user.append("--no-new-privs")
        if pod.security.drop_all_caps:
            user += ["--inh-caps=-all", "--bounding-set=-all"]
        if (pod.cpu_request or 0) >= 1:   # before dropping privileges: raising priority needs CAP_SYS_NICE
            user = ["nice", "-n", str(GUARANTEED_NICE - os.nice(0)), *user]
        script.append(f'exec {" ".join(user)} -- "$@"' if uid != 0 or pod.security.drop_all_caps else 'exec "$@"')
        log_path = d / "log"
        env = self.env(pod, kubeconfig)
        started = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["unshare", "-m", "sh", "-c", "\n".join(script), "pod", *pod.command],
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            threading.Thread(target=self._refresh_hosts, args=(d, proc), daemon=True).start()
            killed, peak = _watch(proc, pod.deadline_s, kill, pod.memory_limit)
        seconds = time.monotonic() - started
        log_text = log_path.read_text(errors="replace")
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # a signal, as the runtime reports it
        if killed == "deadline":
            phase, message = "Failed", pod.deadline_message
        elif killed in ("fault", "memory"):
            phase, message = "Failed", f"main: OOMKilled (exit code {code if code is not None else 137})"
        elif code == 0:
            phase, message = "Succeeded", ""
        else:
            phase, message = "Failed", f"main: Error (exit code {code})"
        result = PodResult(code, phase, message, log=log_text, seconds=seconds, peak_rss=peak)
        self._collect(pod, result, d)
        with self._lock:
            key = pod.template or pod.name
            self.peaks[key] = max(self.peaks.get(key, 0), peak)
        limit = f" limit {pod.memory_limit / 2**20:.0f} MiB" if pod.memory_limit else ""
        (d / "result").write_text(f"{result.phase} exit={code} {seconds:.1f}s peak RSS {peak / 2**20:.0f} MiB{limit}"
                                  f" uid={uid} {result.message}\n")
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


def _host_mounts() -> list[str]:
    """This machine's mount points but the kernel's (/proc, /sys, /dev: a container has its own) and /dev/shm
    (writable in a pod), parents first: what readOnlyRootFilesystem makes read-only in the pod."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if not any(mp == k or mp.startswith(k + "/") for k in ("/proc", "/sys", "/dev")) and mp not in out:
            out.append(mp)
    return sorted(out, key=len)


def _can_enter(path: Path, uid: int, gids: list[int]) -> bool:
    if uid == 0:
        return True
    st = path.stat()
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in gids else 0o001
    return bool(st.st_mode & bit)


def _covers(needed: list[Path], uid: int, gids: list[int], where: Path
            ) -> tuple[list[tuple[Path, Path]], list[tuple[Path, Path]]]:
    """For each outermost folder the pod's user cannot enter on the way to a path it needs: (folder, skeleton),
    a skeleton folder (0755) to mount over it, and (path, place in the skeleton) to bind-mount before that."""
    blocked: dict[Path, list[Path]] = {}
    for path in needed:
        for folder in reversed(path.parents):   # "/" first
            if not _can_enter(folder, uid, gids):
                blocked.setdefault(folder, []).append(path)
                break
    if any(other in folder.parents for folder in blocked for other in blocked):
        raise NotImplementedError(f"nested folders the pod's user cannot enter: {sorted(blocked)}")
    covers, binds = [], []
    for i, (folder, paths) in enumerate(sorted(blocked.items())):
        skeleton = where / str(i)
        skeleton.mkdir(parents=True)
        skeleton.chmod(0o755)
        for path in paths:
            inner = skeleton / path.relative_to(folder)
            for parent in reversed(inner.parents):
                if parent.is_relative_to(skeleton) and not parent.exists():
                    parent.mkdir(mode=0o755)
            inner.mkdir(mode=0o755, exist_ok=True) if path.is_dir() else inner.touch(mode=0o644)
            binds.append((path, inner))
        covers.append((folder, skeleton))
    # a folder holding the skeletons is covered last (its skeletons would be hidden by then)
    return sorted(covers, key=lambda c: where.is_relative_to(c[0])), binds


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    if uid == 0 or (path.stat().st_uid, path.stat().st_gid) == (uid, gid):
        return
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.chown(p, uid, gid, follow_symlinks=False)


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


# kcmp(2) by syscall number (glibc has no wrapper): KCMP_VM answers 0 when two processes share one address space.
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _shares_memory(a: int, b: int) -> bool:
    """Whether `b` runs in `a`'s address space: a child between vfork and exec. CPython (3.10+, _posixsubprocess)
    starts every subprocess by vfork, and until the child's exec its /proc statm shows the parent's resident
    pages: a 690 MiB check step running kustomize then summed to 1385 MiB and was killed over its 1 GiB limit
    (CI run 20 of 2026-12-07), where the kernel's cgroup, which counts a page once, would not have."""
    return _SYS_KCMP is not None and _LIBC.syscall(_SYS_KCMP, a, b, _KCMP_VM, 0, 0) == 0


def _tree_rss(pid: int) -> int:
    """RSS of `pid` and its descendants, as psutil's memory_info().rss (/proc/<pid>/statm's resident pages), a
    child that still shares its parent's address space (vfork, before exec) counted once, with its parent.
    The tree is walked through /proc/<pid>/task/<tid>/children rather than psutil's children(), which reads
    every process's stat on the machine: 10 times a second for every running step, 80 of the 1570 CPU
    samples of the pytest process in a pipeline run (py-spy, 2026-12-07)."""
    total, todo = 0, [(pid, 0)]
    while todo:
        p, parent = todo.pop()
        try:
            # asked before and after the read: an exec in between must not count the parent's pages twice
            shared = parent and _shares_memory(parent, p)
            with open(f"/proc/{p}/statm", "rb") as f:
                resident = int(f.read().split()[1]) * PAGE_BYTES
            if not (shared or (parent and _shares_memory(parent, p))):
                total += resident
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    todo += [(int(c), p) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue   # ended meanwhile (a zombie's statm reads as zeros)
    return total


def _watch(proc: subprocess.Popen, deadline_s: float | None, kill: threading.Event | None,
           memory_limit: int | None) -> tuple[str | None, int]:
    """(why it was stopped or None, the peak RSS of its process tree)."""
    start = time.monotonic()
    peak, next_sample = 0, start
    while proc.poll() is None:
        reason = None
        now = time.monotonic()
        if now >= next_sample:
            next_sample = now + MEMORY_SAMPLE_S
            rss = _tree_rss(proc.pid)
            peak = max(peak, rss)
            if memory_limit is not None and rss > memory_limit:
                reason = "memory"
        if reason is not None:
            pass
        elif deadline_s is not None and now - start >= deadline_s:
            reason = "deadline"
        elif kill is not None and kill.is_set():
            reason = "fault"
        if reason:
            _stop(proc, signal.SIGTERM if reason == "deadline" else signal.SIGKILL)
            return reason, peak
        time.sleep(0.05)
    return None, peak


def _stop(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
