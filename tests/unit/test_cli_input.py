"""Bad input ends in a clear error naming file and field (exit 2), never a traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from workflows.cli.main import main


@pytest.fixture
def overlay(tmp_path):
    """A copy of overlays/local next to the real kustomize/ tree, safe to break."""
    dst = tmp_path / "repo"
    shutil.copytree(ROOT / "kustomize", dst / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", dst / "overlays" / "local")
    return dst / "overlays" / "local"


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("text, field, words", [
    ("name: pd-llm\nmodel: [unclosed\n", "line 3", "invalid YAML"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefil: {}\n", "prefil", "unknown field"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefill: {tensor_parallel_size: two}\n", "prefill.tensor_parallel_size", "integer"),
    ("name: pd-llm\n", "model", "required field is missing"),
    ("name: PD_LLM\nmodel: {id: m, source: s}\n", "name", "pattern"),
    ("- a\n- b\n", "", "expected a mapping"),
    ("name: pd-llm\nmodel: {id: m, source: s}\ndecode: {replicas: 1, autoscaling: {max_replicas: 2}}\n", "decode", "not both"),
])
def test_bad_release_spec(capsys, overlay, text, field, words):
    (overlay / "release.yaml").write_text(text)
    code, out, err = _run(capsys, "check", str(overlay))
    assert code == 2 and out == ""
    assert f"{overlay / 'release.yaml'}: {field}" in err and words in err and "Traceback" not in err


def test_missing_overlay_and_file(capsys, tmp_path):
    code, _, err = _run(capsys, "check", str(tmp_path / "nope"))
    assert code == 2 and "no such overlay directory" in err
    code, _, err = _run(capsys, "check", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "file not found" in err


def test_broken_kustomization_names_the_file(capsys, overlay):
    (overlay / "kustomization.yaml").write_text("resources: [../../kustomize/base]\nnamePrefx: x\n")
    code, _, err = _run(capsys, "render", str(overlay))
    assert code == 2 and "kustomization.yaml" in err and "kustomize build failed" in err and "namePrefx" in err
    (overlay / "kustomization.yaml").write_text("resources: [../../kustomize/bose]\n")
    code, _, err = _run(capsys, "render", str(overlay))
    assert code == 2 and "kustomization.yaml: resources[0]" in err and "does not exist" in err


def test_render_refuses_findings_and_writes_nothing(capsys, overlay, tmp_path):
    (overlay / "release.yaml").write_text((overlay / "release.yaml").read_text().replace("max_model_len: 1024", "max_model_len: 4096"))
    out_file = tmp_path / "out.yaml"
    code, out, err = _run(capsys, "render", str(overlay), "-o", str(out_file))
    assert code == 1 and not out_file.exists() and "max-model-len" in err


def test_check_json_and_stdin_roundtrip(capsys, monkeypatch, tmp_path):
    import io
    import json

    code, _, _ = _run(capsys, "render", str(ROOT / "overlays" / "local"), "-o", str(tmp_path / "m.yaml"))
    assert code == 0
    broken = (tmp_path / "m.yaml").read_text().replace("kv_role: kv_consumer", "kv_role: kv_both")
    monkeypatch.setattr("sys.stdin", io.StringIO(broken))
    code, out, _ = _run(capsys, "check", "-f", "-", "--json")
    report = json.loads(out)
    assert code == 1 and not report["clean"]
    assert [f["rule"] for f in report["findings"] if f["severity"] == "error"] == ["kv-role"]


def test_check_output_is_not_buried_in_import_time_log_lines():
    """Measured before: vLLM's Triton notices as Ray-formatted JSON on every `pdops check`."""
    proc = subprocess.run([sys.executable, "-m", "workflows.cli.main", "check", "overlays/local"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "clean" in proc.stdout + proc.stderr
    assert [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("{")] == []
