"""The step image runs the steps: built the way the Dockerfile builds it, every step command runs.

No Docker engine runs here, so the image's install is replayed instead: the Dockerfile installs only
by `bash scripts/setup.sh` with the environment it sets (pinned below), so this test runs the same
script with that environment into a virtualenv (kept between runs while setup.sh, the Dockerfile and
pyproject.toml are unchanged, with this checkout's code installed again when it differs: tests/step_venv.py)
and then runs the first steps' real commands in it (`pdops render` and `pdops check` of a GPU
overlay, which died with "Neither vLLM nor SGLang is installed" when the image had Ray without vLLM)
and every other subcommand the committed workflows call, with --help. What is not replayed: the base
image's OS packages (python:3.11-slim vs this machine's Python 3.11) and the non-root user.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.step_venv import installed_code_differs, step_venv

DOCKERFILE = ROOT / "Dockerfile"


def dockerfile_env() -> dict[str, str]:
    """The ENV the Dockerfile sets (one ENV instruction with continuation lines)."""
    text = DOCKERFILE.read_text()
    (block,) = re.findall(r"^ENV ((?:.*\\\n)*.*)$", text, flags=re.M)
    pairs = shlex.split(block.replace("\\\n", " "))
    return dict(p.split("=", 1) for p in pairs)


def test_the_dockerfile_installs_only_through_the_setup_script():
    runs = [ln for ln in DOCKERFILE.read_text().splitlines() if ln.startswith("RUN ")]
    installs = [r for r in runs if "pip" in r or "setup.sh" in r]
    assert installs == ["RUN bash scripts/setup.sh && rm -rf /build"], installs
    env = dockerfile_env()
    assert env["PDOPS_SETUP_LAYERS"].split() == ["vllm", "ray", "project"]
    assert env["PDOPS_SETUP_PROJECT"] == "steps" and env["PATH"].startswith(env["PDOPS_VENV"] + "/bin:")
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert "USER 10001:10001" in lines and 'ENTRYPOINT ["pdops"]' in lines
    assert not any(w in "\n".join(lines).upper() for w in ("SECRET", "TOKEN", "PASSWORD", "AWS_ACCESS"))


def step_subcommands() -> set[tuple[str, ...]]:
    """Every `pdops` subcommand the committed workflows run."""
    out = set()
    for name in ("pd-release.yaml", "pd-canary.yaml"):
        for doc in yaml.safe_load_all((ROOT / "kustomize" / "argo" / name).read_text()):
            spec = (doc or {}).get("spec", {})
            for tpl in spec.get("workflowSpec", spec).get("templates", []):
                c = tpl.get("container") or {}
                if c.get("command") == ["pdops"]:
                    out.add((c["args"][0],))
    return out


@pytest.fixture(scope="module")
def image_venv() -> Iterator[Path]:
    """The venv setup.sh makes with the Dockerfile's settings, kept between runs by the key of its inputs
    (tests/step_venv.py: why, and what a kept venv does not re-prove); locked while the tests use it."""
    setup_env = {k: v for k, v in dockerfile_env().items() if k.startswith("PDOPS_SETUP")}
    with step_venv(setup_env) as (venv, done):
        assert done.returncode == 0, done.stderr[-3000:]
        yield venv


def image_env() -> dict[str, str]:
    """This process's environment without what would put this checkout or the test venv before the image's
    own install (PYTHONPATH is set when the tests run from a worktree)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run_step(venv: Path, *args: str) -> subprocess.CompletedProcess:
    env = image_env()
    # The image sets no PDOPS_SCHEMA_DIR: the wheel carries the pinned schemas as package data
    # (workflows/data/schemas), and a non-editable install must find them there, with no setting.
    assert "PDOPS_SCHEMA_DIR" not in dockerfile_env()
    env.pop("PDOPS_SCHEMA_DIR", None)
    env["PATH"] = f"{venv}/bin:{env['PATH']}"
    return subprocess.run([str(venv / "bin" / "pdops"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_image_environment_runs_every_step_command(image_venv):
    # the image's own package, not this checkout (non-editable install)
    where = subprocess.run([str(image_venv / "bin" / "python"), "-c", "import workflows; print(workflows.__file__)"],
                           cwd="/", env=image_env(), capture_output=True, text=True)
    assert str(image_venv) in where.stdout, where
    assert installed_code_differs(image_venv) == []   # a kept venv runs this checkout's code, not an older one
    nixl = subprocess.run([str(image_venv / "bin" / "python"), "-c", "import nixl"], capture_output=True)
    assert nixl.returncode != 0                      # the steps need no NIXL: the image has none
    rendered = run_step(image_venv, "render", "overlays/prod", "-o", "/dev/null")
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    checked = run_step(image_venv, "check", "overlays/prod")
    assert checked.returncode == 0 and "Traceback" not in checked.stderr, checked.stderr[-3000:]
    assert {("render",), ("rollout",), ("validate",), ("promote",), ("rollback",)} <= step_subcommands()
    for (sub,) in sorted(step_subcommands()):
        helped = run_step(image_venv, sub, "--help")
        assert helped.returncode == 0 and "usage: pdops" in helped.stdout, (sub, helped.stderr[-2000:])


def test_the_image_carries_git_for_the_advice_patch():
    """Issue 22 item 6: the balance advice's patch is made with git (workflows/pipeline/advise_patch.py); the image
    installs it from the base image's Debian archive, and nothing else that way."""
    runs = [ln for ln in DOCKERFILE.read_text().replace("\\\n", " ").splitlines() if ln.startswith("RUN ")]
    apt = [r for r in runs if "apt-get install" in r]
    assert len(apt) == 1 and re.search(r"--no-install-recommends\s+git\s+&&", apt[0]), apt
    assert "rm -rf /var/lib/apt/lists/*" in apt[0]
