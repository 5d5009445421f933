"""The processes behind the local target: one Ray on 127.0.0.1 and, for the golden-token check,
a single (non-disaggregated) vLLM engine.

Ray runs as `ray start --head --block` in a process group of its own, so `pdops down` ends exactly
what pdops started. Serve applications are driven the way KubeRay drives a RayService: the serve
config goes to the dashboard's REST API (PUT /api/serve/applications/), status comes back from a
GET on the same path. Environment and pitfalls: ../shared/notes/local-stack.md.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validation.server_metrics import RAY_METRICS_INTERVAL_ENV, ray_export_lag_s
from workflows.errors import InputError
from workflows.targets import vllm_plugin
from workflows.targets.base import Progress, TargetError

# Every Ray and vLLM process of the local stack: the CPU build, 1 GiB KV cache, no hub, no telemetry.
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    # `ray start --node-ip-address=127.0.0.1` is rewritten to the host's routable IP; with the
    # (misnamed) multi-node switch off, Ray keeps every node address on loopback.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "VLLM_LOGGING_LEVEL": "INFO",  # the engines' logs are the evidence when a deploy fails
    vllm_plugin.SWITCH: "0",  # NIXL's progress thread spins a core per engine; see there
    # `pdops down` SIGTERMs `ray start --block`, whose handler (ray/_private/node.py, Ray 2.60
    # _drain_node_before_shutdown) drains the node for up to this many seconds (default 30) waiting for
    # Serve to move its replicas elsewhere. A one-node local Ray has nowhere to move them, so every stop
    # waited the whole 30 s (the e2e tier's teardown: 31 s in CI, 2026-12-07); 0 is Ray's own "no drain".
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}
HOST = "127.0.0.1"
NICENESS = 10
# Ray exports each process's metrics (the engines' ray_vllm_*) every metrics_report_interval_ms:
# default 10 s, floor 1 s (ray/_private/telemetry/open_telemetry_metric_recorder.py, which mirrors
# src/ray/stats/stats.h), read from RAY_<name> by every Ray process. Every bench waits out that lag
# before its server-metrics window opens and after it closes, and vs_stable's paired blocks make
# 2 x blocks benches per load: at 10 s, 4 pairs cost over 2 minutes of waiting; at 2 s, about 30 s.
METRICS_INTERVAL_MS = 2000
ENGINE_ENV[RAY_METRICS_INTERVAL_ENV] = str(METRICS_INTERVAL_MS)


@dataclass(frozen=True)
class Ports:
    """Every port the local stack listens on, from one base (PDOPS_LOCAL_PORT, default 8000)."""

    serve: int        # Serve HTTP: stable at /, candidate at /candidate
    reference: int    # the single-engine reference server of the golden-token check
    metrics: int      # Ray's metrics export (ray_vllm_* of every engine)
    dashboard: int    # dashboard REST API (serve config in, status out)
    gcs: int
    agent: int
    client: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(*(base + i for i in range(7)))

    @classmethod
    def from_env(cls) -> Ports:
        raw = os.environ.get("PDOPS_LOCAL_PORT", "8000")
        base = int(raw) if raw.isdigit() else -1
        # Ray hands out worker ports from 10002-19999 and NIXL side channels sit at 20000-22999.
        if not (1024 <= base <= 10002 - 7 or 23000 <= base <= 65535 - 7):
            raise InputError("PDOPS_LOCAL_PORT", "", f"{raw!r} is not a usable port base",
                             "use 1024-9995 or 23000-65528 (Ray and NIXL own 10002-22999); default 8000")
        return cls.from_base(base)


def _http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - 127.0.0.1 only
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1 only
        text = resp.read().decode() or "null"
    return json.loads(text)


def _alive(pid: int, marker: str) -> bool:
    """True when `pid` runs and is ours (its command line holds `marker`; guards against PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline


def _stop_group(pid: int, marker: str, grace_s: float) -> None:
    """SIGTERM the process (it shuts its children down), then SIGKILL its whole process group."""
    if not _alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid, marker):
        time.sleep(0.5)
    try:
        os.killpg(pid, signal.SIGKILL)  # the group we created with start_new_session
    except (ProcessLookupError, PermissionError):
        pass


class LocalRay:
    """A Ray head on 127.0.0.1 with room for two slots, its PID kept in HOME/ray.pid."""

    def __init__(self, home: Path, ports: Ports) -> None:
        self.home, self.ports = home, ports
        self.pid_file = home / "ray.pid"
        self.interval_file = home / "ray.metrics-interval-ms"   # the running Ray's export interval
        self.log = home / "ray.log"
        # Unix socket paths must stay short, so Ray's temp dir is not under the repo.
        self.temp_dir = Path("/tmp") / f"pdops-ray-{os.getuid()}-{ports.serve}"

    @property
    def dashboard(self) -> str:
        return f"http://{HOST}:{self.ports.dashboard}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.ports.metrics}/metrics"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid, str(self.temp_dir)) else None

    def metrics_lag_s(self) -> float:
        """How stale the running Ray's metrics can be: its export interval plus a quarter (measured at
        10 s: a request showed 10.4 s after it finished); a Ray started without the file (an older
        pdops) is taken to export at Ray's default."""
        try:
            interval_ms: int | None = int(self.interval_file.read_text())
        except (OSError, ValueError):
            interval_ms = None
        return ray_export_lag_s(interval_ms)

    def healthy(self) -> bool:
        try:
            _http("GET", f"{self.dashboard}/api/version", timeout=3)
            return True
        except (OSError, ValueError):
            return False

    def _command(self, resources: dict[str, int]) -> list[str]:
        ray = Path(sys.executable).parent / "ray"
        p = self.ports
        # Niced: on a 2-core machine the engines would otherwise starve the latency harness's event
        # loop (measured: loop lag p99 0.8 s), and a starved client measures itself, not the server.
        return ["nice", "-n", str(NICENESS), str(ray), "start", "--head", "--block", f"--node-ip-address={HOST}",
                f"--port={p.gcs}",
                "--include-dashboard=true", f"--dashboard-host={HOST}", f"--dashboard-port={p.dashboard}",
                f"--dashboard-agent-listen-port={p.agent}", f"--ray-client-server-port={p.client}",
                f"--metrics-export-port={p.metrics}", "--num-cpus=16", f"--resources={json.dumps(resources)}",
                f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]

    def start(self, resources: dict[str, int], progress: Progress, timeout_s: float = 240) -> None:
        """Start Ray unless it already runs; wait for its dashboard."""
        if self.pid() and self.healthy():
            return
        proc = None
        if self.pid() is None:
            self.home.mkdir(parents=True, exist_ok=True)
            progress(f"[ray] starting a local Ray on {HOST} (resources {resources}); log: {self.log}")
            with open(self.log, "ab") as log:
                proc = subprocess.Popen(self._command(resources), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env={**os.environ, **ENGINE_ENV},
                                        start_new_session=True, cwd=self.home)
            self.pid_file.write_text(str(proc.pid))
            self.interval_file.write_text(str(METRICS_INTERVAL_MS))
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if (proc.poll() is not None) if proc else self.pid() is None:
                self.pid_file.unlink(missing_ok=True)
                raise TargetError("the local Ray exited while starting", _tail(self.log))
            if self.healthy():
                progress(f"[ray] ready after {time.monotonic() - started:.0f}s (dashboard {self.dashboard})")
                return
            time.sleep(2)
        raise TargetError(f"the local Ray did not answer on {self.dashboard} within {timeout_s:.0f}s",
                          _tail(self.log))

    def stop(self, progress: Progress) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)  # stale: the process is gone
            return False
        progress(f"[ray] stopping the local Ray (pid {pid})")
        _stop_group(pid, str(self.temp_dir), grace_s=30)
        self.pid_file.unlink(missing_ok=True)
        self.interval_file.unlink(missing_ok=True)
        return True

    def resources(self) -> dict[str, float]:
        """The custom resources the running Ray was started with (its capacity for engines)."""
        try:
            nodes = _http("GET", f"{self.dashboard}/api/v0/nodes")["data"]["result"]["result"]
            total = nodes[0]["resources_total"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return {}
        return {k: v for k, v in total.items() if k.endswith("_node")}

    def deploy(self, applications: list[dict[str, Any]]) -> None:
        """Declare the full set of Serve applications (those left out are deleted), as KubeRay does."""
        body = {"proxy_location": "HeadOnly", "http_options": {"host": HOST, "port": self.ports.serve},
                "applications": applications}
        try:
            _http("PUT", f"{self.dashboard}/api/serve/applications/", body, timeout=60)
        except urllib.error.HTTPError as exc:
            raise TargetError(f"Ray rejected the serve config (HTTP {exc.code})",
                              [exc.read().decode(errors="replace")[:2000]]) from None
        except OSError as exc:
            raise TargetError(f"cannot reach the local Ray dashboard at {self.dashboard}: {exc}") from None

    def applications(self) -> dict[str, dict[str, Any]]:
        """Serve application details by name ({} when Serve has not started)."""
        try:
            data = _http("GET", f"{self.dashboard}/api/serve/applications/", timeout=10)
        except (OSError, ValueError):
            return {}
        return (data or {}).get("applications") or {}


class ReferenceEngine:
    """One plain vLLM OpenAI server (no KV connector): what a P/D answer must equal token for token."""

    MARKER = "vllm.entrypoints.openai.api_server"

    def __init__(self, home: Path, port: int, model_dir: str, model_id: str, engine_kwargs: dict[str, Any]) -> None:
        self.home, self.port = home, port
        self.model_dir, self.model_id, self.engine_kwargs = model_dir, model_id, engine_kwargs
        self.log = home / "reference.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", self.MARKER, "--host", HOST, "--port", str(self.port),
               "--model", self.model_dir, "--served-model-name", self.model_id]
        for key, value in sorted(self.engine_kwargs.items()):  # the same engine args the P/D engines get
            flag = "--" + key.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif value not in (False, None):
                cmd += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
        return cmd

    def __enter__(self) -> ReferenceEngine:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **ENGINE_ENV},
                                         start_new_session=True)
        return self

    def wait_ready(self, progress: Progress, timeout_s: float = 300) -> None:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise TargetError(f"the reference engine exited with {self.proc.returncode}", _tail(self.log))
            try:
                _http("GET", f"{self.base_url}/models", timeout=3)
                progress(f"[golden] reference engine ready after {time.monotonic() - started:.0f}s")
                return
            except (OSError, ValueError):
                time.sleep(2)
        raise TargetError(f"the reference engine was not ready within {timeout_s:.0f}s", _tail(self.log))

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _stop_group(self.proc.pid, self.MARKER, grace_s=20)
            self.proc.wait(timeout=30)


def _tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
