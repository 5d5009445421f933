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
from tests.conftest import ROOT, SCHEMAS

HERE = Path(__file__).parent
_TIER = {"seconds": 0.0, "tests": 0}


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
def runner(argo_root, image_src):
    # Every pod mounts its own emptyDir over /tmp (pod.py), which hides a venv under /tmp: the steps'
    # `pdops` then fails with "python: not found" (seen: a clone in /tmp/alone). Say so once, up front.
    for path in (Path(sys.executable), ROOT):
        if Path("/tmp") in path.resolve().parents:
            pytest.fail(f"the Argo tier cannot run from {path}: every pod mounts an emptyDir over /tmp, "
                        "which hides it; clone the project outside /tmp (e.g. /var/tmp or $HOME)", pytrace=False)
    def make(kubeconfig: Path | None = None, hosts: dict[str, str] | None = None) -> PodRunner:
        return PodRunner(argo_root / "runner", python=sys.executable, image_src=image_src, kubeconfig=kubeconfig,
                         hosts=hosts or {}, schema_dir=SCHEMAS, dockerfile=ROOT / "Dockerfile")
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
