"""One real local stack (Ray Serve LLM P/D on vLLM CPU, NIXL) for the whole e2e tier.

It has its own PDOPS_HOME and port base, is started by the first release and stopped by `pdops
down` when the session ends; pyproject's testpaths run this tier last, so nothing else shares the
machine with it. Helpers here drive `pdops` as a user would: subprocesses and HTTP on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.measure_lock import measuring

PORT = 9400          # the stack's port base: stable at http://127.0.0.1:9400/v1
STABLE = f"http://127.0.0.1:{PORT}/v1"
CANDIDATE = f"http://127.0.0.1:{PORT}/candidate/v1"
DASHBOARD = f"http://127.0.0.1:{PORT + 3}"


def pdops(env: dict, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "workflows.cli.main", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    sys.stderr.write(proc.stderr[-6000:])  # the release's progress, shown when a test fails
    return proc


def status(env: dict) -> dict:
    return json.loads(pdops(env, "status", "--json").stdout)


def complete(base_url: str, max_tokens: int, prompt: str = "ray serve prefill decode", timeout: float = 120) -> dict:
    body = {"model": "pdops-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 7,
            "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(base_url + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def serve_apps() -> dict:
    with urllib.request.urlopen(DASHBOARD + "/api/serve/applications/", timeout=10) as resp:
        return json.loads(resp.read()).get("applications") or {}


def wait_candidate_running(timeout: float = 900) -> dict:
    """The candidate slot's Serve application once it is RUNNING (route /candidate)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for app in serve_apps().values():
            if app.get("route_prefix") == "/candidate" and app.get("status") == "RUNNING":
                return app
        time.sleep(2)
    raise AssertionError("the candidate never became RUNNING")


class LiveTraffic:
    """A user of the stable endpoint: one small completion every `every` seconds, counted."""

    def __init__(self, every: float = 2.0) -> None:
        self.every, self.sent, self.ok, self.failures = every, 0, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                self.ok += complete(STABLE, 4)["usage"]["completion_tokens"] == 4
            except OSError as exc:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {exc}")
            self._stop.wait(self.every)

    def __enter__(self) -> LiveTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def __str__(self) -> str:
        return f"{self.ok}/{self.sent} OK" + (f" (failures: {self.failures[:3]})" if self.failures else "")


def changed_overlay(tmp_path: Path, max_num_seqs: int, **spec_changes) -> Path:
    """overlays/local with another decode engine setting (a new manifest, so a new candidate).

    `spec_changes`: release.yaml fields to set, nested with `__` (validation__request_timeout_s=10)."""
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    path = tmp_path / "overlays" / "local"
    spec = yaml.safe_load((path / "release.yaml").read_text())
    # merged, not replaced: dropping decode's `dtype: float32` alone fails vLLM's NIXL handshake
    # (the kv-compat rule in workflows/checks/kv_compat.py now refuses that before apply)
    spec["decode"]["engine_kwargs"] = {**spec["decode"].get("engine_kwargs", {}), "max_num_seqs": max_num_seqs}
    spec["validation"]["load"] = [{"profile": "balanced", "concurrency": 2, "requests": 6, "warmup_requests": 1}]
    for dotted, value in spec_changes.items():
        *parents, last = dotted.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    (path / "release.yaml").write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """Environment of every pdops call of the tier; `pdops down` (and a check that Ray is gone) at the end.
    The session holds the machine's measuring lock (tests/measure_lock.py): its real stack and its client
    beside an Argo-tier run starve that run's client, whose health overlays/dev gates on; they take turns."""
    home = tmp_path_factory.mktemp("pdops-home")
    env = {**os.environ, "PDOPS_HOME": str(home), "PDOPS_LOCAL_PORT": str(PORT)}
    with measuring("the e2e tier's real stack"):
        yield env
        pdops(env, "down")
    assert not (home / "local" / "ray.pid").exists(), "pdops down left the Ray pid file behind"


@pytest.fixture(scope="session")
def promoted(stack):
    """The first release of overlays/local (cold: model, reference, Ray, candidate, validation)."""
    return pdops(stack, "release", "--overlay", "overlays/local", "--json")
