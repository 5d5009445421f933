"""Faults injected into releases on the REAL local stack; the promise under test: the stable release
keeps serving (a user sends a request every 2 s throughout), the verdict is rollback or a clear
failure, history is intact, and the candidate never lingers.

Runs after tests/e2e/test_release_local.py promoted a stable release (session fixture `promoted`).
Each test prints its figures (stable availability, time to restore) for the fault tables of
docs/troubleshooting.md and docs/measurements.md#faults.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import (
    CANDIDATE,
    LiveTraffic,
    changed_overlay,
    pdops,
    serve_apps,
    status,
    wait_candidate_running,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def stable_digest(stack, promoted):
    assert promoted.returncode == 0, promoted.stdout
    st = status(stack)
    assert st["stable"]["state"] == "ready" and st["candidate"]["release"] is None
    return st["stable"]["release"]["digest"]


def assert_stable_kept(stack, digest: str) -> dict:
    st = status(stack)
    assert st["stable"]["release"]["digest"] == digest and st["stable"]["state"] == "ready"
    assert st["candidate"]["release"] is None
    assert st["last_good"]["digest"] == digest
    assert [a for a in serve_apps().values() if a.get("route_prefix") == "/candidate"] == []
    return st


def failed_release(stack, stable_digest: str, overlay, fault: str, *args: str) -> dict:
    """`pdops release --json` of `overlay` while a user calls stable: exit 1, every one of the user's
    requests OK, stable kept. Prints the figures for the fault table (docs/measurements.md#faults); returns the
    outcome."""
    with LiveTraffic() as users:
        started = time.monotonic()
        proc = pdops(stack, "release", "--overlay", str(overlay), *args, "--json")
        took = time.monotonic() - started
    print(f"fault {fault}: verdict in {took:.0f}s, stable {users}")
    assert proc.returncode == 1, proc.stdout
    assert users.ok == users.sent > 0
    assert_stable_kept(stack, stable_digest)
    return json.loads(proc.stdout)


def test_candidate_never_ready_times_out_and_is_removed(stack, stable_digest, tmp_path):
    out = failed_release(stack, stable_digest, changed_overlay(tmp_path, 40), "never-ready", "--timeout", "20")
    assert out["verdict"] == "failed" and "not RUNNING after 20s" in out["reasons"][0]


def test_release_killed_after_rollout_is_undone_and_a_second_release_is_refused(stack, stable_digest, tmp_path):
    # A long benchmark keeps the release validating (about 40 s of compat, then minutes of load)
    # while a second release is started and refused; only then is the pipeline killed.
    overlay = changed_overlay(tmp_path, 48, validation__load=[{"profile": "balanced", "concurrency": 2,
                                                               "requests": 400, "warmup_requests": 1}])
    log = open(tmp_path / "release.log", "w")
    with LiveTraffic() as users:
        release = subprocess.Popen([sys.executable, "-m", "workflows.cli.main", "release", "--overlay", str(overlay)],
                                   env=stack, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_candidate_running()
            second = pdops(stack, "release", "--overlay", str(changed_overlay(tmp_path / "b", 56)))
            assert second.returncode == 1 and "another release is running" in second.stderr
            assert release.poll() is None, "the release ended before it could be killed"
            os.kill(release.pid, signal.SIGKILL)      # the pipeline dies between rollout and promote
            release.wait(timeout=30)
        finally:
            if release.poll() is None:
                release.kill()
        left = status(stack)
        assert left["candidate"]["release"] is not None        # the half-done candidate is visible
        started = time.monotonic()
        undo = pdops(stack, "rollback", "--if-candidate-pending", "--reason", "pipeline killed")
        restored = time.monotonic() - started
    print(f"fault pipeline-killed: restored in {restored:.0f}s, stable {users}")
    assert undo.returncode == 0 and "dropped candidate" in undo.stdout
    assert users.ok == users.sent > 0
    st = assert_stable_kept(stack, stable_digest)
    assert st["history"][-1]["verdict"] == "rollback" and st["history"][-1]["reasons"] == ["pipeline killed"]


@pytest.mark.parametrize("phase", ["Decode", "Prefill"])
def test_engine_killed_during_validation_rolls_back(stack, stable_digest, tmp_path, phase):
    overlay = changed_overlay(tmp_path, 64 if phase == "Decode" else 72)
    log = open(tmp_path / "release.log", "w")
    with LiveTraffic() as users:
        release = subprocess.Popen([sys.executable, "-m", "workflows.cli.main", "release", "--overlay", str(overlay),
                                    "--json"], env=stack, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        app = wait_candidate_running()
        time.sleep(8)                                  # validation has begun (compat suite)
        replica = next(r for name, d in app["deployments"].items() if name.startswith(phase + ":")
                       for r in d["replicas"])
        os.kill(replica["pid"], signal.SIGKILL)        # a process of the stack this test started
        killed = time.monotonic()
        out, _ = release.communicate(timeout=2400)
        took = time.monotonic() - killed
    print(f"fault {phase.lower()}-killed: verdict {took:.0f}s after the kill, stable {users}")
    assert release.returncode == 1, out
    verdict = json.loads(out)
    assert verdict["verdict"] == "rollback"
    assert any(r.startswith(f"engines replaced during validation: {phase.lower()} ") for r in verdict["reasons"]), \
        verdict["reasons"]
    assert users.ok == users.sent > 0
    assert_stable_kept(stack, stable_digest)


def test_candidate_answering_5xx_and_hanging_mid_stream_rolls_back(stack, stable_digest, tmp_path, monkeypatch):
    """The real release flow, target and candidate; between validation and the candidate sits
    tests/fakes/fault_proxy.py, which answers every 4th completion 503 and stalls every 3rd stream
    after its first events. Run in this process so the target can hand validation the proxy's URL."""
    from tests.fakes.fault_proxy import FaultProxy
    from workflows.pipeline import steps
    from workflows.targets.local import LocalTarget

    for name in ("PDOPS_HOME", "PDOPS_LOCAL_PORT"):
        monkeypatch.setenv(name, stack[name])
    overlay = changed_overlay(tmp_path, 80, validation__request_timeout_s=10)
    target = LocalTarget()
    real_endpoint = target.endpoint
    with FaultProxy(CANDIDATE, fail_every=4, hang_every=3, hang_after_events=3) as proxy, LiveTraffic() as users:
        # validation reads the candidate's URL from target.endpoint("candidate") (steps.validate_slot,
        # the stage the Argo validate step runs too), so that is where the proxy is put in between
        monkeypatch.setattr(target, "endpoint", lambda slot, *a, **k: (
            real_endpoint(slot, *a, **k).model_copy(update={"base_url": proxy.base_url}) if slot == "candidate"
            else real_endpoint(slot, *a, **k)))
        started = time.monotonic()
        out = steps.release(overlay, target, steps.new_run_dir(tmp_path / "runs", "local"), print,
                            revision="fault-proxy")
        took = time.monotonic() - started
    print(f"fault 5xx+hang: {proxy.injected} injected, verdict {out.verdict} in {took:.0f}s, stable {users}")
    assert proxy.injected["5xx"] > 0 and proxy.injected["hang"] > 0
    assert out.verdict == "rollback" and any("error rate" in r for r in out.reasons), out.reasons
    assert users.ok == users.sent > 0
    st = assert_stable_kept(stack, stable_digest)
    assert st["history"][-1]["verdict"] == "rollback" and st["history"][-1]["revision"] == "fault-proxy"


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs, filled on demand: writes then fail with ENOSPC as on a full disk."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(folder) -> None:
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_run_folder_filling_up_during_validation_rolls_back(stack, stable_digest, tmp_path, small_disk):
    overlay = changed_overlay(tmp_path, 88)
    with LiveTraffic() as users:
        release = subprocess.Popen([sys.executable, "-m", "workflows.cli.main", "release", "--overlay", str(overlay),
                                    "--runs", str(small_disk), "--json"], env=stack, cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=open(tmp_path / "release.log", "w"), text=True)
        try:
            wait_candidate_running()
            fill(small_disk)                       # the disk is full before validation writes a report
            started = time.monotonic()
            out, _ = release.communicate(timeout=2400)
            took = time.monotonic() - started
        finally:
            if release.poll() is None:
                release.kill()
    print(f"fault disk-full: verdict in {took:.0f}s after the disk filled, stable {users}")
    assert release.returncode == 1, out
    verdict = json.loads(out)
    assert verdict["verdict"] == "failed"
    assert "No space left on device" in verdict["reasons"][0] and "could not record" in verdict["reasons"][0]
    assert users.ok == users.sent > 0
    st = assert_stable_kept(stack, stable_digest)
    assert st["history"][-1]["verdict"] == "rollback"


def test_kv_connector_that_moves_no_kv_is_caught_by_golden_tokens(stack, stable_digest, tmp_path):
    """vLLM's DecodeBenchConnector passes every lint and starts fine, but decode fills its KV cache
    with dummy values instead of receiving prefill's. Measured: compat, latency, error rate, the KV
    counter (5,696 prompt tokens "arrived by KV transfer") and NIXL failures all pass; only the
    golden tokens differ from the single-engine reference."""
    overlay = changed_overlay(tmp_path, 112, kv_transfer={"connector": "DecodeBenchConnector", "backends": ["UCX"],
                                                          "buffer_device": "cpu"})
    out = failed_release(stack, stable_digest, overlay, "kv-dummy")
    assert out["verdict"] == "rollback" and out["checks_failed"] >= 1
    assert any(r.startswith("golden tokens:") for r in out["reasons"]), out["reasons"]


def test_kv_transport_that_cannot_start_fails_with_the_engines_root_cause(stack, stable_digest, tmp_path):
    """UCX restricted to `self` on decode: NIXL cannot set up its backend, the engine never starts,
    Serve gives up after 3 tries; the verdict names NIXL's error from the worker's log."""
    overlay = changed_overlay(tmp_path, 120, decode__env={"VLLM_CPU_OMP_THREADS_BIND": "1", "UCX_TLS": "self"})
    out = failed_release(stack, stable_digest, overlay, "kv-transport")
    assert out["verdict"] == "failed" and "DEPLOY_FAILED" in out["reasons"][0]
    assert any("NIXL_ERR_BACKEND" in r for r in out["reasons"]), out["reasons"]
