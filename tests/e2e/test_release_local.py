"""`pdops release` on the REAL local stack: Ray Serve LLM prefill/decode (vLLM CPU, NIXL) on 127.0.0.1.

Nothing is emulated. One Ray is brought up for this module (own PDOPS_HOME and ports) and stopped
at its end. A good release must promote; then a candidate that cannot meet its SLO must roll back
while the stable release keeps answering live requests. Asserts on verdicts, slot state, token
counts, finish_reason, determinism, golden tokens and KV-transfer counters; never on generated
text or absolute latency (figures from the tiny CPU model are reports).
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

pytestmark = pytest.mark.e2e
PORT = 9400   # the stack's port base: stable at http://127.0.0.1:9400/v1


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Environment of every pdops call here; `pdops down` (and a check that Ray is gone) at the end."""
    home = tmp_path_factory.mktemp("pdops-home")
    env = {**os.environ, "PDOPS_HOME": str(home), "PDOPS_LOCAL_PORT": str(PORT)}
    yield env
    pdops(env, "down")
    pid_file = home / "local" / "ray.pid"
    assert not pid_file.exists(), "pdops down left the Ray pid file behind"


def pdops(env: dict, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "workflows.cli", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    sys.stderr.write(proc.stderr[-6000:])  # the release's progress, shown when a test fails
    return proc


def complete(base_url: str, max_tokens: int, prompt: str = "ray serve prefill decode") -> dict:
    body = {"model": "pdops-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 7,
            "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(base_url + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def run_folder(proc: subprocess.CompletedProcess) -> Path:
    return ROOT / json.loads(proc.stdout)["run"]


@pytest.fixture(scope="module")
def promoted(stack):
    proc = pdops(stack, "release", "--overlay", "overlays/local", "--json")
    return proc


def test_good_release_is_promoted_and_serves_at_the_stable_route(stack, promoted):
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr[-3000:]
    out = json.loads(promoted.stdout)
    assert out["verdict"] == "promote"
    run = run_folder(promoted)

    golden = json.loads((run / "golden.json").read_text())
    assert golden["ok"] and golden["matched"] == golden["prompts"] == 4 and golden["tokens_compared"] == 64

    bench = json.loads(next(run.glob("bench-0-*.json")).read_text())
    assert bench["requests_ok"] == 16 and bench["errors"] == 0
    assert bench["lengths"]["output_mismatches"] == 0          # every answer had the asked-for length
    kv = bench["server"]["kv"]
    assert kv["external_kv_prompt_tokens"] > 0 and kv["nixl_failed_transfers"] == 0

    compat = json.loads((run / "compat.json").read_text())
    assert not compat["required_failures"]

    st = json.loads(pdops(stack, "status", "--json").stdout)
    assert st["stable"]["state"] == "ready" and st["stable"]["release"]["digest"] == out["digest"]
    assert st["candidate"]["release"] is None
    assert [h["verdict"] for h in st["history"]] == ["promote"]

    stable = f"http://127.0.0.1:{PORT}/v1"
    first, again = complete(stable, 6), complete(stable, 6)
    choice = first["choices"][0]
    assert choice["finish_reason"] == "length" and first["usage"]["completion_tokens"] == 6
    assert choice["token_ids"] == again["choices"][0]["token_ids"]   # temperature 0 + seed: deterministic


def test_same_revision_again_is_a_no_op(stack, promoted):
    proc = pdops(stack, "release", "--overlay", "overlays/local", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"] == "unchanged"


@pytest.fixture
def broken_overlay(tmp_path):
    """overlays/local with a changed engine (so a new candidate is deployed) and an SLO no CPU meets."""
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    path = tmp_path / "overlays" / "local"
    spec = yaml.safe_load((path / "release.yaml").read_text())
    spec["decode"]["engine_kwargs"] = {"max_num_seqs": 32}
    spec["slo"]["prefill"] = {"ttft_p90_ms": 1}
    spec["validation"]["load"] = [{"profile": "balanced", "concurrency": 2, "requests": 6, "warmup_requests": 1}]
    (path / "release.yaml").write_text(yaml.safe_dump(spec))
    return path


def test_candidate_missing_its_slo_rolls_back_while_stable_serves(stack, promoted, broken_overlay):
    assert promoted.returncode == 0
    before = json.loads(pdops(stack, "status", "--json").stdout)["stable"]["release"]["digest"]
    sent, ok, stop = [0], [0], threading.Event()

    def live_traffic():
        while not stop.is_set():
            sent[0] += 1
            try:
                ok[0] += complete(f"http://127.0.0.1:{PORT}/v1", 4)["usage"]["completion_tokens"] == 4
            except OSError:
                pass
            time.sleep(2)

    users = threading.Thread(target=live_traffic, daemon=True)
    users.start()
    try:
        proc = pdops(stack, "release", "--overlay", str(broken_overlay), "--json")
    finally:
        stop.set()
        users.join(timeout=150)
    print(f"stable availability during the broken release: {ok[0]}/{sent[0]}", file=sys.stderr)
    assert proc.returncode == 1, proc.stdout
    out = json.loads(proc.stdout)
    assert out["verdict"] == "rollback" and any("ttft" in r for r in out["reasons"])
    assert sent[0] >= 10 and ok[0] == sent[0]

    st = json.loads(pdops(stack, "status", "--json").stdout)
    assert st["stable"]["release"]["digest"] == before and st["stable"]["state"] == "ready"
    assert st["candidate"]["release"] is None
    assert [h["verdict"] for h in st["history"]] == ["promote", "rollback"]
    assert st["last_good"]["digest"] == before
