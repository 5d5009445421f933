"""The step image's environment as a virtualenv on this machine, kept between test runs.

Built the way the Dockerfile builds the image: `bash scripts/setup.sh` with the Dockerfile's PDOPS_SETUP_*
settings (layers vllm, ray, project; the project non-editable, no dev extras) into a fresh virtualenv. A
fresh build took 359 s of the unit tier's 1253 s with pip (docs/measurements.md, "Where the suite's time goes"),
about 40 s with uv since 2026-12-07 (setup.sh), still a build worth keeping.

So the venv is kept in a cache folder (PDOPS_STEP_VENV_CACHE, default ~/.cache/pdops-tests/step-venv,
outside the clone so a fresh clone on the same machine finds it, as it finds uv's cache),
one per key: the bytes of everything the install reads from this repository besides the code (setup.sh
with its pins, the Dockerfile with its ENV, pyproject.toml with the dependencies) and the Python that
makes the venv. A machine with no such folder (a fresh CI runner) builds it on the first run: the cold
figure in docs/measurements.md. What a kept venv does not re-prove: the vllm and ray layers are installed
again only when a key input changes, as setup.sh's stamps skip an unchanged layer in a developer's `.venv`,
so a new release of an unpinned dependency on the index is met at the next key change, not every run. The
project layer is installed again only when the installed workflows/ and validation/ (their .py files and
package data) differ from the code wanted (`installed_code_differs`): then its stamp is removed and setup.sh's
`uv pip install --reinstall-package pdops "$root"` reinstalls the local directory, so the code under test is the code that runs. The code
wanted is `src`: this checkout for tests/unit/test_step_image.py, the revision's `git archive` for the Argo
tier (tests/argo/conftest.py), which is what the image would be built from (setup.sh runs from `src`).
The build runs at nice BUILD_NICE (10, absolute): below the Argo tier's client (-5) and fake engines (0), whose
latency it must not disturb, when a tier builds it; CI builds it before the tiers (`make step-venv`, `main`).

Locking (flock on the key's `lock` file), so that the Argo tier (one pytest process holding the venv for its
whole session, ~17 min) and the step image test (another process, beside it in `make ci-tiers`) share it:
- a user holds a shared lock while it runs the venv's programs; any number of users at once;
- building or reinstalling the project takes the exclusive lock (waiting for the current users to finish),
  then goes back to a shared lock and checks again: converting a flock is not atomic, so another run may
  have installed its own code in between, and then this one takes the exclusive lock again.
So two runs wanting the same code (one clone, or two worktrees at the same revision) never wait for each
other's session: the second finds the code installed and takes a shared lock. Two runs wanting different
code (uncommitted changes in one worktree, or two revisions) cannot share one venv: the second waits until
the first's users are done (up to the Argo tier's whole session), then reinstalls its code; it says so on
stderr while it waits. Only the KEEP most recently used keys stay (a key another run holds is kept).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]   # not tests.conftest's: this module runs with the machine's Python (stdlib only)

KEY_INPUTS = ("scripts/setup.sh", "Dockerfile", "pyproject.toml")
BUILD_NICE = 10   # the module docstring says why
KEEP = 2   # a steps venv is about 4 GB on disk
_HELD: set[Path] = set()   # the key folders this process holds (a shared lock)


def cache_root() -> Path:
    if os.environ.get("PDOPS_STEP_VENV_CACHE"):
        return Path(os.environ["PDOPS_STEP_VENV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdops-tests" / "step-venv"


def key(src: Path = ROOT) -> str:
    h = hashlib.sha256()
    for rel in KEY_INPUTS:
        h.update(rel.encode() + b"\0" + (src / rel).read_bytes() + b"\0")
    # The Python the venv is made from: setup.sh runs `$PYTHON -m venv` with this test venv's Python, whose
    # venv points at its base install (pyvenv.cfg `home`), not at the test venv: so a fresh clone of the
    # project (a new test venv, same base Python) finds the venv its predecessor kept.
    h.update(f"{sys.base_prefix}\0{sys.version}".encode())
    return h.hexdigest()[:16]


def _lock(f, mode: int, block: bool = True) -> bool:
    try:
        fcntl.flock(f, mode | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _prune(root: Path, current: Path) -> None:
    """Remove all but the KEEP most recently used keys, skipping any another run holds."""
    others = sorted((d for d in root.iterdir() if d.is_dir() and d != current),
                    key=lambda d: (d / "built").stat().st_mtime if (d / "built").exists() else 0.0, reverse=True)
    for stale in others[KEEP - 1:]:
        with open(stale / "lock", "a") as f:
            if _lock(f, fcntl.LOCK_EX, block=False):
                shutil.rmtree(stale, ignore_errors=True)


def _ready(venv: Path, src: Path) -> bool:
    """Built, and running the code of `src`."""
    try:
        return (venv.parent / "built").exists() and not installed_code_differs(venv, src)
    except (OSError, subprocess.CalledProcessError):   # a venv without its python: build again
        return False


@contextmanager
def step_venv(setup_env: dict[str, str], src: Path = ROOT) -> Iterator[tuple[Path, subprocess.CompletedProcess]]:
    """(the venv, setup.sh's run) with the venv running the code of `src` and held (shared lock) for the block;
    `setup_env` the PDOPS_SETUP_* settings. setup.sh's run is a stand-in with exit 0 when nothing was installed."""
    root = cache_root()
    folder = root / key(src)
    folder.mkdir(parents=True, exist_ok=True)
    venv, built = folder / "venv", folder / "built"
    done = subprocess.CompletedProcess(["setup.sh"], 0, "", "[step venv] kept: the code wanted is installed\n")
    with open(folder / "lock", "a") as lock:
        while True:
            _lock(lock, fcntl.LOCK_SH)
            if _ready(venv, src):
                break
            if folder in _HELD:   # waiting for ourselves would never end
                raise RuntimeError(f"this process already runs {venv} with other code than {src}'s (untracked files "
                                   "under workflows/ or validation/?): run the two in separate pytest processes")
            if not _lock(lock, fcntl.LOCK_EX, block=False):   # not atomic: the shared lock is dropped first
                print(f"[step venv] {venv} runs other code for another test run: waiting for its users to finish",
                      file=sys.stderr, flush=True)
                _lock(lock, fcntl.LOCK_EX)
            if _ready(venv, src):
                continue
            if venv.exists() and not built.exists():   # a build that did not finish (killed, failed)
                shutil.rmtree(venv)
            (venv / ".pdops-setup" / "project").unlink(missing_ok=True)   # the code of `src`
            env = {**os.environ, **setup_env, "PDOPS_VENV": str(venv), "PYTHON": sys.executable}
            env.pop("PYTHONPATH", None)
            done = subprocess.run(["nice", "-n", str(max(0, BUILD_NICE - os.nice(0))), "bash",
                                   str(src / "scripts" / "setup.sh")], env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                break
            built.touch()
            _prune(root, folder)
        if built.exists():
            built.touch()   # the most recently used (_prune keeps it)
        _HELD.add(folder)
        try:
            yield venv, done
        finally:
            _HELD.discard(folder)


def installed_code_differs(venv: Path, src: Path = ROOT) -> list[str]:
    """The files of workflows/ and validation/ the wheel carries (.py and package data) that differ between the
    venv's install and `src`."""
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    package_data = tomllib.loads((src / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {}).get(
        "package-data", {})

    def tree(base: Path) -> dict[str, bytes]:
        files = {p for pkg in ("workflows", "validation") for p in (base / pkg).rglob("*.py")}
        files |= {p for pkg, globs in package_data.items() for g in globs for p in (base / pkg).glob(g)}
        return {str(p.relative_to(base)): p.read_bytes() for p in files if p.is_file()}
    mine, theirs = tree(src), tree(site)
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def main() -> int:
    """`make step-venv`: the step venv for this checkout, built (or found) before the test tiers start.

    .ci/run runs it beside `make lint`: built inside the Argo tier (its `step_image` fixture) with the e2e stack
    and the unit tier beside it, a cold build took about 20 minutes on 2 cores (2026-12-07, docs/measurements.md)
    against 255 s with only light work beside it, and every Argo-tier test waits for it. The tiers then find it
    ready (the Argo tier's `git archive` of a clean checkout installs the same files: `installed_code_differs`)."""
    import time

    from tests.dockerfile import dockerfile_image

    env, _ = dockerfile_image(ROOT / "Dockerfile")
    started = time.monotonic()
    with step_venv({k: v for k, v in env.items() if k.startswith("PDOPS_SETUP")}) as (venv, done):
        if done.returncode != 0:
            print(f"[step venv] the step image's install failed (scripts/setup.sh):\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            return done.returncode
        print(f"[step venv] {venv} ready in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
