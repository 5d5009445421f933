"""The pre-commit hook: which overlays changed files affect, and the hook's own command on file names.

The hook is run the way pre-commit 4.x runs a hook (pre_commit/clientlib.py, lang_base.basic_run_hook):
the `files` pattern selects the staged paths (re.search), then `shlex.split(entry) + args + paths`
runs from the repository root; `require_serial` keeps every path in one call.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from workflows.render.changed import affected_overlays

HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())


@pytest.fixture
def repo(tmp_path):
    """kustomize/ and every overlay copied, plus `canary`: an overlay built on overlays/prod."""
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays", tmp_path / "overlays")
    canary = tmp_path / "overlays" / "canary"
    canary.mkdir()
    (canary / "kustomization.yaml").write_text("resources: [../prod]\nnamePrefix: canary-\n")
    shutil.copyfile(tmp_path / "overlays" / "prod" / "release.yaml", canary / "release.yaml")
    return tmp_path


def names(paths):
    return [str(p) for p in paths]


# Every committed overlay (an example such as prod-multinode included) plus the fixture's canary.
ALL = sorted(["overlays/canary"] + [f"overlays/{p.name}" for p in (ROOT / "overlays").iterdir()
                                    if (p / "kustomization.yaml").exists()])


@pytest.mark.parametrize("files, expected", [
    (["kustomize/base/service.yaml"], ALL),
    (["kustomize/components/efa/new-file.yaml"], ALL),       # not referenced yet: kustomize/ is shared
    (["overlays/local/release.yaml"], ["overlays/local"]),
    (["overlays/dev/node-groups.yaml", "overlays/local/kustomization.yaml"], ["overlays/dev", "overlays/local"]),
    (["overlays/prod/node-groups.yaml"], ["overlays/canary", "overlays/prod"]),  # canary includes prod
    (["overlays/local/deleted-patch.yaml"], ["overlays/local"]),                 # a deletion still counts
    (["README.md", "workflows/cli/main.py", "overlays/README.md"], []),
    ([], []),
])
def test_changed_files_map_to_the_overlays_they_affect(repo, files, expected):
    assert names(affected_overlays(files, cwd=repo)) == expected


def test_paths_are_taken_relative_to_where_the_command_runs(repo):
    assert names(affected_overlays(["../kustomize/base/pdb.yaml"], cwd=repo / "overlays")) == [
        o.removeprefix("overlays/") for o in ALL]
    assert names(affected_overlays(["release.yaml"], cwd=repo / "overlays" / "staging")) == ["."]


def test_files_outside_the_repository_affect_nothing(repo, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    (outside / "kustomization.yaml").write_text("resources: []\n")
    assert affected_overlays([str(outside / "kustomization.yaml")], cwd=repo) == []


def test_a_broken_overlay_is_still_checked_when_its_files_change(repo):
    (repo / "overlays" / "dev" / "kustomization.yaml").write_text("resources: [../../nowhere]\n")
    assert names(affected_overlays(["overlays/dev/kustomization.yaml"], cwd=repo)) == ["overlays/dev"]


# ---- the hook as pre-commit runs it -------------------------------------------------------------

def test_the_hook_names_the_pdops_console_script():
    [hook] = HOOKS
    assert hook["id"] == "pdops-check" and hook["require_serial"] is True
    assert shlex.split(hook["entry"])[:3] == ["pdops", "check", "--changed"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pdops"] == "workflows.cli.main:main"


def run_hook(repo: Path, staged: list[str]) -> subprocess.CompletedProcess:
    """What pre-commit runs for a commit staging these paths (None when no path matches: it skips)."""
    [hook] = HOOKS
    selected = [f for f in staged if re.search(hook["files"], f)]
    if not selected:
        return None
    argv = shlex.split(hook["entry"]) + hook.get("args", []) + selected
    assert argv[0] == "pdops"   # the console script = `python -m workflows.cli.main` of this tree
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "workflows.cli.main", *argv[1:]], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900)


def test_hook_passes_clean_overlays_and_skips_unrelated_commits(repo):
    assert run_hook(repo, ["README.md", "workflows/cli/main.py"]) is None
    proc = run_hook(repo, ["overlays/local/release.yaml", "README.md"])
    assert proc.returncode == 0, proc.stderr
    assert "overlays/local: 5 objects checked, clean" in proc.stdout and "overlays/prod" not in proc.stdout


def test_hook_fails_the_commit_on_a_finding_or_bad_input_in_any_touched_overlay(repo):
    release = repo / "overlays" / "local" / "release.yaml"
    release.write_text(release.read_text().replace("max_model_len: 1024", "max_model_len: 4096"))
    spec = repo / "overlays" / "dev" / "release.yaml"
    spec.write_text(spec.read_text() + "prefil: {}\n")
    proc = run_hook(repo, ["overlays/local/release.yaml", "overlays/dev/release.yaml", "overlays/staging/release.yaml"])
    assert proc.returncode == 2
    assert f"error: {Path('overlays/dev/release.yaml')}: prefil: unknown field" in proc.stderr
    assert "error[max-model-len] overlays/local/release.yaml" in proc.stdout
    assert re.search(r"^overlays/local: 5 objects checked, [1-9] error\(s\)", proc.stdout, re.M)
    assert "overlays/staging: 6 objects checked, clean" in proc.stdout   # the others are still checked
