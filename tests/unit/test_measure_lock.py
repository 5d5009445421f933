"""tests/measure_lock.py: the lock the measuring tiers take turns on (Argo pipeline runs, the e2e session)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from tests.conftest import ROOT
from tests.measure_lock import measuring

HOLD = """
import sys, time
from tests.measure_lock import measuring
with measuring("other process") as waited:
    print(f"in {time.time():.3f} waited {waited:.2f}", flush=True)
    time.sleep(float(sys.argv[1]))
    print(f"leaving {time.time():.6f}", flush=True)   # the last moment it surely held the lock
"""


def test_a_second_process_waits_until_the_first_releases(tmp_path, monkeypatch):
    monkeypatch.setenv("PDOPS_TEST_MEASURE_LOCK", str(tmp_path / "lock"))
    first = subprocess.Popen([sys.executable, "-c", HOLD, "1.5"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    entered = first.stdout.readline()
    assert entered.startswith("in ")
    with measuring("this test") as waited:
        got = time.time()
    left = float(first.stdout.read().split()[1])   # printed while it still held the lock
    assert first.wait() == 0
    assert got >= left and waited > 0.5, (got, left, waited)


def test_threads_of_one_process_share_it_and_the_last_releases(tmp_path, monkeypatch):
    monkeypatch.setenv("PDOPS_TEST_MEASURE_LOCK", str(tmp_path / "lock"))
    inside = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with measuring("thread"):
                inside.wait()      # both threads inside at once: a second flock would block here until the timeout
        except BaseException as e:  # noqa: BLE001 - a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads) and errors == [], errors
    other = subprocess.run([sys.executable, "-c", HOLD, "0"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert other.returncode == 0 and "waited 0.00" in other.stdout, other.stdout + other.stderr
