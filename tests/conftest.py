"""Shared fixtures: overlays are rendered once per session (Ray's config models take ~15 s to import)."""
from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = sorted(p.name for p in (ROOT / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The pinned schemas kept in the repository (workflows/checks/schema.py PINNED_SCHEMAS), or the override.
SCHEMAS = Path(os.environ.get("PDOPS_SCHEMA_DIR") or ROOT / "workflows" / "data" / "schemas")


def local_overlay(tmp_path: Path, edit: Callable[[dict], object] | None = None) -> Path:
    """A copy of overlays/local under tmp_path, with kustomize/ beside it (the overlay's relative paths
    reach ../../kustomize); `edit` changes its release.yaml in place."""
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    path = tmp_path / "overlays" / "local"
    if edit is not None:
        spec = yaml.safe_load((path / "release.yaml").read_text())
        edit(spec)
        (path / "release.yaml").write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session", autouse=True)
def _own_check_cache(tmp_path_factory):
    """Tests start from an empty check cache (workflows/render/cache.py), never the user's."""
    before = os.environ.get("PDOPS_CACHE_DIR")
    os.environ["PDOPS_CACHE_DIR"] = str(tmp_path_factory.mktemp("pdops-cache"))
    yield
    if before is None:
        os.environ.pop("PDOPS_CACHE_DIR", None)
    else:
        os.environ["PDOPS_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def rendered_overlays():
    from workflows.render.manifest import render

    return {env: render(ROOT / "overlays" / env) for env in OVERLAYS}


@pytest.fixture
def rendered(rendered_overlays):
    """A fresh, mutable copy of one overlay's render; tests break it on purpose."""
    def get(env: str = "prod"):
        return copy.deepcopy(rendered_overlays[env])
    return get
