"""`pdops diff` in the release: the spec's scenario and known-divergence files are checked when the
spec loads, and validate_candidate's gate blocks on an unexpected divergence (fakes on 127.0.0.1)."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import local_overlay
from tests.fakes.diff_fake import DiffFake, Plant
from workflows.errors import InputError
from workflows.pipeline import steps
from workflows.spec.release import load_spec
from workflows.targets.base import Endpoint

pytestmark = pytest.mark.usefixtures("judged_after_the_reference")   # tests/unit/conftest.py says why


@pytest.fixture
def overlay(tmp_path):
    path = local_overlay(tmp_path)
    (path / "team.jsonl").write_text(json.dumps({"name": "batch", "prompt": ["a b", "c d"], "max_tokens": 4,
                                                 "temperature": 0, "return_token_ids": True}) + "\n")
    _edit(path, scenarios=["team.jsonl"], known_divergences=None, diff=True, load=[{"profile": "balanced", "concurrency": 1, "requests": 2,
                                                 "warmup_requests": 0}])
    return path


def _edit(path, **validation):
    spec = yaml.safe_load((path / "release.yaml").read_text())
    spec["slo"]["kv_transfer"] = "ignored"
    spec["validation"].update(validation)
    (path / "release.yaml").write_text(yaml.safe_dump(spec))


def test_the_spec_names_scenario_files_that_exist_in_the_repository(overlay):
    assert load_spec(overlay).validation.scenarios == ["team.jsonl"]
    for value, problem in ((["missing.jsonl"], "no such file"), (["../../../x.jsonl"], "outside the repository")):
        _edit(overlay, scenarios=value)
        with pytest.raises(InputError) as err:
            load_spec(overlay)
        assert err.value.field == "validation.scenarios[0]" and problem in err.value.problem
        assert err.value.file.endswith("release.yaml")


def test_a_bad_line_in_a_scenario_file_fails_when_the_spec_loads(overlay):
    (overlay / "team.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(InputError) as err:
        load_spec(overlay)
    assert err.value.file.endswith("team.jsonl") and err.value.field == "line 2"


def test_an_absolute_path_is_refused_by_the_spec_model(overlay):
    _edit(overlay, known_divergences="/etc/passwd")
    with pytest.raises(InputError) as err:
        load_spec(overlay)
    assert err.value.field == "validation.known_divergences"


@pytest.mark.parametrize("known, verdict_ok", [(None, False), ("known.yaml", True)])
def test_the_gate_blocks_an_unexpected_divergence_and_passes_a_known_one(overlay, tmp_path, known, verdict_ok):
    (overlay / "known.yaml").write_text(
        "divergences:\n"
        + "".join(f"  - {{case: '{c}', reason: planted, link: 'https://example.invalid/{c}'}}\n"
                  for c in ("cmpl_batch_prompts", "cmpl_batch_token_prompts", "scenario:batch")))
    if known:
        _edit(overlay, known_divergences=known)
    spec = load_spec(overlay)
    run = tmp_path / "run"
    run.mkdir()
    with DiffFake(model="pdops-tiny") as ref, DiffFake(model="pdops-tiny", plant=Plant(wrong_tokens_on_prompt=1)) as cand:
        out = steps.validate_candidate(Endpoint(base_url=cand.base_url), spec, run, lambda _: None, None,
                                       reference_url=ref.base_url, release_file=overlay / "release.yaml")
    check = next(c for c in out.decision.checks if c.check == "diff")
    assert check.ok is verdict_ok, check.message
    assert ("3 known, 0 differ" if verdict_ok else "0 known, 3 differ") in check.message
    assert (run / "diff.json").exists() and "scenario:batch" in (run / "diff.md").read_text()


def test_the_release_runs_golden_tokens_and_the_diff_on_one_reference_the_target_serves(overlay, tmp_path, monkeypatch):
    """`pdops release` end to end on a recording target (tests/unit/test_release_flow.py): the target's
    reference server is entered once, after the loads; golden answers and the differential suite
    both come from it, and an unexpected divergence rolls the candidate back."""
    from tests.unit.test_release_flow import RecordingTarget

    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    with DiffFake(model="pdops-tiny") as ref, DiffFake(model="pdops-tiny", plant=Plant(wrong_tokens_on_prompt=1)) as cand:
        target = RecordingTarget(Endpoint(base_url=cand.base_url))
        target.reference_url = ref.base_url
        run = steps.new_run_dir(tmp_path / "runs", "local")
        out = steps.release(overlay, target, run, lambda m: None, revision="test")
    assert out.verdict == "rollback" and target.calls == ["apply", "wait_ready", "rollback"]
    assert target.reference_servers == 1
    assert any("differ" in r for r in out.reasons), out.reasons
    golden = json.loads((run / "golden.json").read_text())   # chat prompts: the planted batch bug spares them
    assert len(golden["cases"]) == 4 and all(c["ok"] for c in golden["cases"]), golden
    assert (run / "diff.json").exists()
