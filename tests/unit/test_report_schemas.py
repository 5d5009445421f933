"""The published report schemas (validation/schemas/) are the models' own, and reports that real
producer runs write validate against them, with every unmeasured figure null and explained.

Producers run as users run them: `pdops compat/bench/diff/gate --json` against the fakes in
tests/fakes, and a release end to end (tests/unit/test_diff_release.py's recording target) whose
run folder holds every report kind."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.fakes.diff_fake import DiffFake, Plant
from tests.fakes.known_timing_server import KnownTimingServer
from validation.reports.base import unexplained
from validation.reports.bench import BenchReport
from validation.reports.schema import REPORTS, SCHEMA_DIR, drift, generate
from workflows.cli.main import main


def validate(name: str, path: Path) -> dict[str, Any]:
    """The file against the committed schema (Draft 2020-12, formats not asserted); returns its data."""
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    data = json.loads(path.read_text())   # strict JSON: json.loads accepts NaN, so check below
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text(), path
    jsonschema.Draft202012Validator(schema).validate(data)
    return data


def explained(bench: dict[str, Any]) -> None:
    """docs/reports.md: every null figure of a bench has a reason in `missing`."""
    assert unexplained(bench, bench["missing"], BenchReport.BY_DESIGN) == [], bench["missing"]
    for path, reason in bench["missing"].items():
        assert reason and path.split(".")[0] in bench, (path, reason)


def test_committed_schemas_equal_the_generated_ones(tmp_path, capsys):
    assert drift() == [], "regenerate with `pdops schema`"
    assert {p.name for p in SCHEMA_DIR.glob("*.schema.json")} == {f"{n}.schema.json" for n in REPORTS}
    for schema in generate().values():
        jsonschema.Draft202012Validator.check_schema(schema)
    # the check fails on a hand edit and names the file
    assert main(["schema", "--out", str(tmp_path)]) == 0
    edited = tmp_path / "bench.schema.json"
    edited.write_text(edited.read_text().replace('"title": "BenchReport"', '"title": "Edited"'))
    capsys.readouterr()
    assert main(["schema", "--check", "--out", str(tmp_path)]) == 1
    assert str(edited) in capsys.readouterr().out


def test_compat_report_of_a_real_run_validates(tmp_path):
    with KnownTimingServer(first_token_delay=0.002, inter_token_delay=0.0005, tokens=16) as s:
        code = main(["compat", "--base-url", s.base_url, "--model", "fake-model", "--json", str(tmp_path / "c.json")])
    data = validate("compat", tmp_path / "c.json")
    assert code == 0 and data["ok"] and len(data["cases"]) >= 19


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    """`pdops bench` against the known-timing server with its metrics scraped."""
    folder = tmp_path_factory.mktemp("bench")
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.002, tokens=8) as s:
        assert main(["bench", "--base-url", s.base_url, "--model", "fake-model", "--prompt-tokens", "16",
                     "--output-tokens", "8", "--concurrency", "2", "--requests", "6",
                     "--metrics-url", f"http://127.0.0.1:{s.port}/metrics", "--json", str(folder / "b.json")]) == 0
    return folder / "b.json"


def test_bench_report_of_a_real_run_validates_and_explains_its_nulls(bench_file):
    data = validate("bench", bench_file)
    explained(data)
    assert data["requests_ok"] == 6 and data["ttft_ms"]["count"] == 6 and data["server"]["histograms"]
    assert data["missing"] == {}      # everything was measured: no reason needed


def test_a_bench_without_server_metrics_says_so_instead_of_zero(tmp_path):
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.001, tokens=4) as s:
        assert main(["bench", "--base-url", s.base_url, "--model", "fake-model", "--prompt-tokens", "8",
                     "--output-tokens", "4", "--concurrency", "1", "--requests", "2",
                     "--json", str(tmp_path / "b.json")]) == 0
    data = validate("bench", tmp_path / "b.json")
    explained(data)
    assert data["server"] is None and "no metrics URL" in data["missing"]["server"]


def test_a_run_with_no_successful_request_is_null_not_zero(tmp_path):
    """Every request refused: no latency, no rate; each null with its reason, and the gate fails on it."""
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.001, tokens=4) as s:
        code = main(["bench", "--base-url", s.base_url + "/nowhere", "--model", "fake-model", "--prompt-tokens", "8",
                     "--output-tokens", "4", "--concurrency", "1", "--requests", "2",
                     "--json", str(tmp_path / "b.json")])
    data = validate("bench", tmp_path / "b.json")
    explained(data)
    assert code == 1 and data["requests_ok"] == 0 and data["errors"] == 2
    assert data["ttft_ms"]["p90"] is None and "no successful request" in data["missing"]["ttft_ms"]
    assert data["slo_attainment"] == 0.0 and data["goodput_rps"] == 0.0   # measured: 0 of 2 met the SLOs
    from tests.conftest import ROOT

    assert main(["gate", "--bench", str(tmp_path / "b.json"), "--release", str(ROOT / "overlays" / "local" / "release.yaml"),
                 "--out", str(tmp_path / "r"), "--json", str(tmp_path / "d.json")]) == 1
    ttft = next(c for c in validate("decision", tmp_path / "d.json")["checks"] if c["check"] == "ttft_p90_ms")
    assert not ttft["ok"] and ttft["value"] is None and "no successful request" in ttft["message"]
    assert "`ttft_ms` is null: no successful request" in (tmp_path / "r" / "summary.md").read_text()


def test_gate_decision_and_run_report_validate(bench_file, tmp_path):
    from tests.conftest import ROOT

    release = ROOT / "overlays" / "local" / "release.yaml"
    code = main(["gate", "--bench", str(bench_file), "--release", str(release), "--out", str(tmp_path / "r"),
                 "--json", str(tmp_path / "d.json")])
    decision = validate("decision", tmp_path / "d.json")
    run = validate("run", tmp_path / "r" / "report.json")
    assert code == 1 and decision["verdict"] == "rollback"   # no compat report: never promoted
    assert run["decision"] == decision and run["benches"][0]["requests_ok"] == 6
    compat = next(c for c in decision["checks"] if c["check"] == "compat")
    assert compat["ok"] is False and compat["value"] is None and "no compatibility report" in compat["message"]


def test_diff_report_of_a_real_run_validates(tmp_path):
    with DiffFake(model="m") as ref, DiffFake(model="m", plant=Plant(status_500_on="logit_bias")) as cand:
        code = main(["diff", "--base-url", cand.base_url, "--reference-url", ref.base_url, "--model", "m",
                     "--json", str(tmp_path / "diff.json")])
    data = validate("diff", tmp_path / "diff.json")
    assert code == 1 and data["summary"]["differs"] >= 1 and data["kind"] == "diff"


def test_a_release_run_folder_validates(tmp_path, monkeypatch, judged_after_the_reference):
    """A whole release (tests/unit/test_diff_release.py's: a candidate with a planted P/D batch bug,
    the golden tokens and the diff on the target's reference): every report in its run folder."""
    import shutil

    from tests.conftest import ROOT
    from tests.unit.test_diff_release import _edit
    from tests.unit.test_release_flow import RecordingTarget
    from workflows.pipeline import steps
    from workflows.targets.base import Endpoint

    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    path = tmp_path / "overlays" / "local"
    (path / "team.jsonl").write_text(json.dumps({"name": "batch", "prompt": ["a b", "c d"], "max_tokens": 4,
                                                 "temperature": 0, "return_token_ids": True}) + "\n")
    _edit(path, scenarios=["team.jsonl"], known_divergences=None, diff=True,
          load=[{"profile": "balanced", "concurrency": 1, "requests": 2, "warmup_requests": 0}])
    with DiffFake(model="pdops-tiny") as ref, DiffFake(model="pdops-tiny", plant=Plant(wrong_tokens_on_prompt=1)) as cand:
        target = RecordingTarget(Endpoint(base_url=cand.base_url))
        target.reference_url = ref.base_url
        folder = steps.new_run_dir(tmp_path / "runs", "local")
        out = steps.release(path, target, folder, lambda m: None, revision="test")
    assert out.verdict == "rollback"
    release = validate("release", folder / "release.json")
    assert release["verdict"] == "rollback" and release["report"]["json"] == str(folder / "report.json")
    run = validate("run", folder / "report.json")
    validate("compat", folder / "compat.json")
    validate("golden", folder / "golden.json")
    validate("diff", folder / "diff.json")
    for bench in folder.glob("bench-*.json"):
        explained(validate("bench", bench))
    assert run["verdict"] == "rollback" and run["compat"]["cases"] and len(run["benches"]) == 1
    assert any(c["check"] == "diff" and not c["ok"] for c in run["decision"]["checks"])


def test_a_report_of_another_shape_fails_the_schema():
    """The schemas have teeth: a latency summary given as text, a verdict outside the enum."""
    schema = json.loads((SCHEMA_DIR / "bench.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kind": "bench", "ttft_ms": "fast"}, schema)
    decision = json.loads((SCHEMA_DIR / "decision.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kind": "decision", "verdict": "maybe", "reasons": []}, decision)
