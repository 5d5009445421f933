"""Shared fixtures: overlays are rendered once per session (Ray's config models take ~15 s to import)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = sorted(p.name for p in (ROOT / "overlays").iterdir() if (p / "kustomization.yaml").exists())
SCHEMAS = Path(__import__("os").environ.get("PDOPS_SCHEMA_DIR", ROOT.parent / "shared" / "schemas"))


@pytest.fixture(scope="session")
def rendered_overlays():
    from workflows.manifest import render

    return {env: render(ROOT / "overlays" / env) for env in OVERLAYS}


@pytest.fixture
def rendered(rendered_overlays):
    """A fresh, mutable copy of one overlay's render; tests break it on purpose."""
    def get(env: str = "prod"):
        return copy.deepcopy(rendered_overlays[env])
    return get
