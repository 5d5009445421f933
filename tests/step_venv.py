"""The step image's environment as a virtualenv on this machine, kept between test runs.

Built the way the Dockerfile builds the image: `bash scripts/setup.sh` with the Dockerfile's PDOPS_SETUP_*
settings (layers vllm, ray, project; the project non-editable, no dev extras) into a fresh virtualenv. A
fresh build took 359 s of the unit tier's 1253 s (docs/measurements.md, "Where the suite's time goes"): pip
unpacks vLLM CPU, torch and Ray (about 3 GB) from the machine's wheels and local indexes, so pip's cache
has nothing to save (its HTTP cache stays empty: `file://` indexes are not cached).

So the venv is kept in a cache folder (PDOPS_STEP_VENV_CACHE, default ~/.cache/pdops-tests/step-venv,
outside the clone so a fresh clone on the same machine finds it, as it finds pip's cache),
one per key: the bytes of everything the install reads from this repository besides the code (setup.sh
with its pins, the Dockerfile with its ENV, pyproject.toml with the dependencies) and the Python that
makes the venv. A machine with no such folder (a fresh CI runner) builds it on the first run: the cold
figure in docs/measurements.md. What a kept venv does not re-prove: the vllm and ray layers are installed
again only when a key input changes, as setup.sh's stamps skip an unchanged layer in a developer's `.venv`,
so a new release of an unpinned dependency on the index is met at the next key change, not every run. The
project layer is installed again every time (its stamp is removed first, and setup.sh's `pip install
"$root"` reinstalls a local directory), so the code under test is the code that runs;
`installed_code_differs` checks that.

A lock (flock on the key's folder) serialises two test runs (worktrees) using one key: the second waits
while the first reinstalls the project and runs its steps. Only the KEEP most recently used keys stay.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import ROOT

KEY_INPUTS = ("scripts/setup.sh", "Dockerfile", "pyproject.toml")
KEEP = 2   # a steps venv is about 4 GB on disk


def cache_root() -> Path:
    if os.environ.get("PDOPS_STEP_VENV_CACHE"):
        return Path(os.environ["PDOPS_STEP_VENV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdops-tests" / "step-venv"


def key() -> str:
    h = hashlib.sha256()
    for rel in KEY_INPUTS:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    # The Python the venv is made from: setup.sh runs `$PYTHON -m venv` with this test venv's Python, whose
    # venv points at its base install (pyvenv.cfg `home`), not at the test venv: so a fresh clone of the
    # project (a new test venv, same base Python) finds the venv its predecessor kept.
    h.update(f"{sys.base_prefix}\0{sys.version}".encode())
    return h.hexdigest()[:16]


def _locked(path: Path, block: bool = True):
    f = open(path, "a")   # held for the caller's block, closed by it
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def _prune(root: Path, current: Path) -> None:
    """Remove all but the KEEP most recently used keys, skipping any another run holds."""
    others = sorted((d for d in root.iterdir() if d.is_dir() and d != current),
                    key=lambda d: (d / "built").stat().st_mtime if (d / "built").exists() else 0.0, reverse=True)
    for stale in others[KEEP - 1:]:
        lock = _locked(stale / "lock", block=False)
        if lock is not None:
            with lock:
                shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def step_venv(setup_env: dict[str, str]) -> Iterator[tuple[Path, subprocess.CompletedProcess]]:
    """(the venv, setup.sh's run) with the venv locked for the block; `setup_env` the PDOPS_SETUP_* settings."""
    root = cache_root()
    folder = root / key()
    folder.mkdir(parents=True, exist_ok=True)
    lock = _locked(folder / "lock")
    assert lock is not None
    with lock:
        venv, built = folder / "venv", folder / "built"
        if venv.exists() and not built.exists():   # a build that did not finish (killed, failed)
            shutil.rmtree(venv)
        (venv / ".pdops-setup" / "project").unlink(missing_ok=True)   # the code under test, every time
        env = {**os.environ, **setup_env, "PDOPS_VENV": str(venv), "PYTHON": sys.executable}
        done = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True,
                              text=True, timeout=1800)
        if done.returncode == 0:
            built.touch()
            _prune(root, folder)
        yield venv, done


def installed_code_differs(venv: Path) -> list[str]:
    """The .py files of workflows/ and validation/ that differ between the venv's install and this checkout."""
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())

    def tree(base: Path) -> dict[str, bytes]:
        return {str(p.relative_to(base)): p.read_bytes() for pkg in ("workflows", "validation")
                for p in (base / pkg).rglob("*.py")}
    mine, theirs = tree(ROOT), tree(site)
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
