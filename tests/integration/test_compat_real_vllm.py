"""The compatibility suite against a REAL vLLM (CPU build) serving the locally built tiny model.

Nothing is emulated here: one `vllm.entrypoints.openai.api_server` process on 127.0.0.1 (about a
minute to start on 2 cores). Asserts on case outcomes and token counts, never on generated text.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration
ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    from workflows.tiny_model import build

    model = build("pdops-tiny")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "pdops-tiny", "--host", "127.0.0.1", "--port", str(port),
         "--enforce-eager", "--max-model-len", "1024"],
        env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}; see {log.name}")
            try:
                urllib.request.urlopen(base + "/v1/models", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM not ready after 600 s; see {log.name}")
                time.sleep(2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_compat_suite_passes_on_real_vllm(vllm_server):
    from validation import compat

    result = compat.run(vllm_server + "/v1", "pdops-tiny", api_key=None, optional=[],
                        api_key_required=False, only=None, progress=lambda _: None)
    cases = {c["name"]: c["status"] for c in result["cases"]}
    failed = {n: s for n, s in cases.items() if s == "fail"}
    assert failed == {}, result
    assert cases["auth_401"] == "skip" and cases["determinism"] == "pass"


def test_bench_measures_real_vllm_and_joins_server_histograms(vllm_server):
    from validation import profiles
    from validation.bench import run_bench

    result = run_bench(vllm_server + "/v1", "pdops-tiny", profiles.custom(32, 16), concurrency=2, requests=6,
                       metrics_url=vllm_server + "/metrics")
    assert result["requests_ok"] == 6 and result["errors"] == 0
    assert result["lengths"]["output_mismatches"] == 0  # ignore_eos: exactly the asked-for tokens, by usage
    server = result["server"]["histograms"]["time_to_first_token_seconds"]
    assert server["metric"] == "vllm:time_to_first_token_seconds" and server["count"] == 6
    assert result["ttft_ms"]["p50"] > 0 and result["tpot_ms"]["p50"] > 0
