"""Faults injected into releases on the REAL local stack; the promise under test: the stable release
keeps serving (a user sends a request every 2 s throughout), the verdict is rollback or a clear
failure, history is intact, and the candidate never lingers.

Runs after tests/e2e/test_release_local.py promoted a stable release (session fixture `promoted`).
Each test prints its figures (stable availability, time to restore) for the README's fault table.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import LiveTraffic, changed_overlay, pdops, serve_apps, status, wait_candidate_running

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


def test_candidate_never_ready_times_out_and_is_removed(stack, stable_digest, tmp_path):
    overlay = changed_overlay(tmp_path, 40)
    with LiveTraffic() as users:
        started = time.monotonic()
        proc = pdops(stack, "release", "--overlay", str(overlay), "--timeout", "20", "--json")
        took = time.monotonic() - started
    print(f"fault never-ready: verdict in {took:.0f}s, stable {users}")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["verdict"] == "failed" and "not RUNNING after 20s" in out["reasons"][0]
    assert users.ok == users.sent > 0
    assert_stable_kept(stack, stable_digest)


def test_release_killed_after_rollout_is_undone_and_a_second_release_is_refused(stack, stable_digest, tmp_path):
    overlay = changed_overlay(tmp_path, 48)
    log = open(tmp_path / "release.log", "w")
    with LiveTraffic() as users:
        release = subprocess.Popen([sys.executable, "-m", "workflows.cli", "release", "--overlay", str(overlay)],
                                   env=stack, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_candidate_running()
            second = pdops(stack, "release", "--overlay", str(changed_overlay(tmp_path / "b", 56)))
            assert second.returncode == 1 and "another release is running" in second.stderr
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
        release = subprocess.Popen([sys.executable, "-m", "workflows.cli", "release", "--overlay", str(overlay),
                                    "--json"], env=stack, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        app = wait_candidate_running()
        time.sleep(8)                                  # validation has begun (compat suite)
        replica = next(r for name, d in app["deployments"].items() if name.startswith(phase + ":")
                       for r in d["replicas"])
        os.kill(replica["pid"], signal.SIGKILL)        # a process of the stack this test started
        out, _ = release.communicate(timeout=2400)
    print(f"fault {phase.lower()}-killed: stable {users}")
    assert release.returncode == 1, out
    verdict = json.loads(out)
    assert verdict["verdict"] in ("rollback", "failed") and verdict["reasons"]
    assert users.ok == users.sent > 0
    assert_stable_kept(stack, stable_digest)
