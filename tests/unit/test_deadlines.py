"""checks/deadlines.py: `pdops check` refuses a workflow whose deadlines cannot contain the spec's waits
(Argo Workflows v4.0.10: pod deadline = min(template, what is left of the workflow's), workflowpod.go;
retryStrategy.backoff.maxDuration counts from the first try and kills the running one, operator.go
processNodeRetries)."""
from __future__ import annotations

import copy
import shutil

import pytest

from tests.conftest import ROOT
from workflows.argo import definitions as argo
from workflows.checks.deadlines import problems, seconds
from workflows.cli.main import main
from workflows.spec.release import Timeouts


@pytest.fixture
def repo(tmp_path):
    """overlays/local beside the real kustomize/ tree (kustomize/argo included), safe to edit."""
    dst = tmp_path / "repo"
    shutil.copytree(ROOT / "kustomize", dst / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", dst / "overlays" / "local")
    return dst


def _check(capsys, overlay):
    code = main(["check", str(overlay)])
    return code, capsys.readouterr().out


def test_committed_workflows_contain_the_committed_overlays(capsys, repo):
    code, out = _check(capsys, repo / "overlays" / "local")
    assert code == 0 and "error[deadlines]" not in out, out


def test_a_longer_restore_in_release_yaml_is_refused_until_the_workflows_are_regenerated(capsys, repo):
    spec = repo / "overlays" / "local" / "release.yaml"
    spec.write_text(spec.read_text() + "timeouts: {restore_s: 7200}\n")
    code, out = _check(capsys, repo / "overlays" / "local")
    assert code == 1
    assert "error[deadlines]" in out and "pd-release.yaml" in out and "pd-canary.yaml" in out
    assert "spec.templates[exit-rollback].activeDeadlineSeconds" in out and "fix: regenerate" in out
    # regenerated from the widest timeouts of the overlays (argo.pipeline_timeouts), the deadline contains it
    assert argo.pipeline_timeouts(repo).restore_s == 7200
    assert argo.deadlines(argo.pipeline_timeouts(repo))["exit-rollback"] == 7200 + 300 + 30 + 300


def test_the_canary_committed_before_the_rule_is_refused():
    """The issue's figures: validate-stable 1200s vs 1800s reference wait, rollback 1200s vs 3600s restore,
    the workflow 1500s for a longer chain."""
    canary = copy.deepcopy(argo.canary_objects()[0])
    spec = canary["spec"]["workflowSpec"]
    for t in spec["templates"]:
        if t["name"] in ("validate-stable", "rollback"):
            t["activeDeadlineSeconds"] = 1200
    spec["activeDeadlineSeconds"] = 1500
    found = dict(problems(canary, Timeouts()))
    assert set(found) == {"spec.templates[validate-stable].activeDeadlineSeconds",
                          "spec.templates[rollback].activeDeadlineSeconds", "spec.activeDeadlineSeconds"}
    assert "3930s" in found["spec.templates[rollback].activeDeadlineSeconds"]


def test_a_max_duration_shorter_than_every_try_is_refused():
    release = copy.deepcopy(argo.release_objects()[0])
    rollout = next(t for t in release["spec"]["templates"] if t["name"] == "rollout")
    rollout["retryStrategy"]["backoff"]["maxDuration"] = f"{rollout['activeDeadlineSeconds']}s"
    found = dict(problems(release, Timeouts()))
    assert list(found) == ["spec.templates[rollout].retryStrategy.backoff.maxDuration"]
    del rollout["activeDeadlineSeconds"]
    assert "has no deadline" in dict(problems(release, Timeouts()))["spec.templates[rollout].activeDeadlineSeconds"]


@pytest.mark.parametrize("text, value", [(90, 90), ("90", 90), ("90s", 90), ("2m", 120), ("1h30m", 5400),
                                         ("soon", None), ("5x", None)])
def test_argo_durations(text, value):
    assert seconds(text) == value
