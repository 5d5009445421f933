"""The diff's request fields kept in the render cache (workflows/render/diff_fields.py): what check keeps
is what the installed packages give, a validate process reads it back without importing vLLM, and
anything else is a miss that reads the packages. Nothing emulated: the real cache on a temp folder."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from validation.diff import matrix
from workflows.render import cache, diff_fields


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PDOPS_NO_CACHE", raising=False)
    return tmp_path


def test_kept_fields_are_the_installed_ones(cache_dir):
    assert diff_fields.cached() is None
    diff_fields.remember()
    assert diff_fields.cached() == matrix.schema_fields()
    assert matrix.coverage(diff_fields.cached()) == matrix.coverage()


def test_a_process_with_kept_fields_runs_the_coverage_without_importing_vllm(cache_dir):
    diff_fields.remember()
    code = ("import json, sys\nfrom validation.diff import matrix\nfrom workflows.render import diff_fields\n"
            "cov = matrix.coverage(diff_fields.cached())\n"
            "print(json.dumps({'vllm': 'vllm' in sys.modules, 'cov': cov}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                                    text=True, env={"PDOPS_CACHE_DIR": str(cache_dir), "PATH": "/usr/bin:/bin",
                                                    "PYTHONPATH": str(ROOT)}).stdout)
    assert out == {"vllm": False, "cov": json.loads(json.dumps(matrix.coverage()))}


def test_other_versions_or_a_corrupt_entry_are_a_miss(cache_dir, monkeypatch):
    diff_fields.remember()
    [entry] = (cache_dir / "diff-fields").glob("*.json")
    entry.write_text("{not json")
    assert diff_fields.cached() is None
    diff_fields.remember()
    versions = {"vllm": "0.0.1", "openai": cache.version("openai")}
    monkeypatch.setattr(cache, "version", lambda d: versions[d])
    assert diff_fields.cached() is None


def test_without_vllm_nothing_is_kept(cache_dir, monkeypatch):
    only_sdk = {api: {"openai": per["openai"]} for api, per in matrix.schema_fields().items()}
    monkeypatch.setattr(matrix, "schema_fields", lambda: only_sdk)
    diff_fields.remember()
    assert diff_fields.cached() is None
