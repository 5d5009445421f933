"""The Argo execution tier: every test here is marked `argo`; the tier's wall time is printed at the end."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.argo.pod import PodRunner
from tests.dockerfile import dockerfile_image
from tests.conftest import ROOT

HERE = Path(__file__).parent
_TIER: dict = {"seconds": 0.0, "tests": 0}
_RUNNERS: list[PodRunner] = []


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.argo)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.monotonic()
    yield
    if Path(str(item.fspath)).is_relative_to(HERE):
        _TIER["seconds"] += time.monotonic() - started
        _TIER["tests"] += 1


def pytest_terminal_summary(terminalreporter):
    if _TIER["tests"]:
        from tests.measure_lock import WAITED
        terminalreporter.write_line(f"argo execution tier: {_TIER['tests']} tests in {_TIER['seconds']:.1f} s "
                                    f"({WAITED['seconds']:.0f} s of it waiting for the measuring lock)")
    if "venv" in _TIER:
        terminalreporter.write_line(f"argo execution tier: step venv {_TIER['venv']}")
    peaks: dict[str, int] = {}
    for r in _RUNNERS:
        for template, peak in r.peaks.items():
            peaks[template] = max(peaks.get(template, 0), peak)
    if peaks:   # pod.py's memory watcher: each template's largest pod, against its limit
        terminalreporter.write_line("argo execution tier: peak RSS by template (MiB): " + ", ".join(
            f"{t} {b / 2**20:.0f}" for t, b in sorted(peaks.items(), key=lambda kv: -kv[1])))


def revision_under_test() -> str:
    """The commit the pipeline releases and the step image is built from: HEAD, or the working tree
    as a commit object when it has uncommitted changes (`git stash create`: no ref is touched), so
    the tier tests what is on disk. Untracked files are not in it."""
    stash = subprocess.run(["git", "-C", str(ROOT), "stash", "create"], capture_output=True, text=True, check=True)
    if stash.stdout.strip():
        return stash.stdout.strip()
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="session")
def argo_root():
    """Host side of the pods. Not under /tmp: every pod mounts its own emptyDir over /tmp."""
    root = Path(tempfile.mkdtemp(prefix="pdops-argo-", dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def revision():
    return revision_under_test()


@pytest.fixture(scope="session")
def image_src(argo_root, revision):
    """The pdops code baked into the step image, built from the revision under test."""
    dest = argo_root / "image-src"
    dest.mkdir()
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", revision], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    return dest


@pytest.fixture(scope="session")
def step_image(image_src):
    """The step image's install: the Dockerfile's own install line (`bash scripts/setup.sh` with its PDOPS_SETUP_*
    settings) from the revision under test, kept between runs (tests/step_venv.py: a cold build takes minutes;
    the project is reinstalled only when its code differs), held with a shared lock for the session."""
    from tests.step_venv import step_venv

    env, _ = dockerfile_image(image_src / "Dockerfile")
    started = time.monotonic()
    with step_venv({k: v for k, v in env.items() if k.startswith("PDOPS_SETUP")}, src=image_src) as (venv, done):
        if done.returncode != 0:
            pytest.fail(f"the step image's install failed (scripts/setup.sh):\n{done.stderr[-3000:]}", pytrace=False)
        _TIER["venv"] = f"{venv} ready in {time.monotonic() - started:.0f} s"
        yield venv


@pytest.fixture(scope="session")
def runner(argo_root, image_src, step_image):
    # Every pod mounts its own emptyDir over /tmp (pod.py), which hides what is under /tmp: the steps' `pdops`
    # then fails with "python: not found" (seen: a clone in /tmp/alone). Say so once, up front.
    for path in (step_image, Path(sys.base_prefix)):
        if Path("/tmp") in path.resolve().parents:
            pytest.fail(f"the Argo tier cannot run from {path}: every pod mounts an emptyDir over /tmp, which hides "
                        "it; keep the step venv (PDOPS_STEP_VENV_CACHE) and Python outside /tmp", pytrace=False)

    def make(kubeconfig: Path | None = None, hosts: dict[str, str] | None = None,
             tokens: dict[str, str] | None = None) -> PodRunner:
        made = PodRunner(argo_root / "runner", venv=step_image, kubeconfig=kubeconfig, hosts=hosts or {},
                         dockerfile=image_src / "Dockerfile", tokens=tokens)
        _RUNNERS.append(made)
        return made
    return make


@pytest.fixture(scope="session")
def make_pipeline(argo_root, runner, revision):
    """Test clusters for the committed workflows (scenario.py), torn down at the end of the session."""
    import tests.fakes.kube.kuberay as fake_kuberay
    from tests.argo.scenario import PipelineCluster, engine_factory

    made = []
    patch = pytest.MonkeyPatch()
    patch.setattr(fake_kuberay, "EngineApp", engine_factory)

    def make() -> PipelineCluster:
        made.append(PipelineCluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=argo_root)), runner, revision))
        return made[-1]
    yield make
    for c in made:
        c.close()
    patch.undo()


@pytest.fixture
def pipeline(make_pipeline):
    c = make_pipeline()
    yield c
    c.close()
