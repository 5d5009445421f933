"""The pinned upstream schemas travel with the repository (issue 23): found with no setting, intact."""
from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "refresh_schemas.py"


def test_the_check_finds_the_pinned_schemas_with_no_setting(monkeypatch):
    from workflows.checks.schema import PINNED_SCHEMAS, schema_dir_from_env

    monkeypatch.delenv("PDOPS_SCHEMA_DIR", raising=False)
    assert schema_dir_from_env() == PINNED_SCHEMAS
    assert PINNED_SCHEMAS.is_relative_to(ROOT)            # inside the clone, nothing beside it
    assert (PINNED_SCHEMAS / "kuberay-v1.7.0" / "ray.io_rayservices.yaml").is_file()
    monkeypatch.setenv("PDOPS_SCHEMA_DIR", "/elsewhere")  # the override still wins
    assert str(schema_dir_from_env()) == "/elsewhere"


def test_pinned_files_match_their_checksums():
    done = subprocess.run([sys.executable, str(SCRIPT), "--verify"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "10 pinned schema files match" in done.stdout


def test_an_edited_or_stray_schema_is_refused(tmp_path):
    dest = tmp_path / "schemas"
    shutil.copytree(ROOT / "workflows" / "data" / "schemas", dest)
    crd = dest / "kuberay-v1.7.0" / "ray.io_rayservices.yaml"
    crd.write_text(crd.read_text().replace("rayClusterConfig", "rayClusterConfigX", 1))
    (dest / "kuberay-v1.7.0" / "extra.yaml").write_text("{}\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "--verify", "--dest", str(dest)], capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert "ray.io_rayservices.yaml: differs from the pinned upstream file" in done.stderr
    assert "extra.yaml: a file no source pins" in done.stderr
