"""The pipeline stages as plain typed functions: what `pdops` commands and Argo steps call."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workflows.checks.findings import Finding
from workflows.checks.rules import lint
from workflows.errors import InputError
from workflows.manifest import Rendered, load_manifest, render
from workflows.serve_config import build_serve_config, validate_with_ray
from workflows.spec import load_spec


def build_config(overlay: Path) -> dict[str, Any]:
    """The Ray Serve application config of an overlay, validated by Ray's own models."""
    spec = load_spec(overlay)
    config = build_serve_config(spec)
    validate_with_ray(config, str(Path(overlay) / "release.yaml"))
    return config


def check_rendered(rendered: Rendered, schema_dir: Path) -> list[Finding]:
    """Every finding for a rendered release: cross-layer rules, then the pinned schemas."""
    from workflows.checks.schema import validate_objects

    findings = lint(rendered)
    if rendered.overlay is None and rendered.serve_config:
        # An overlay's serve config was validated by Ray while rendering; a file's was not.
        try:
            validate_with_ray(rendered.serve_config, rendered.file)
        except InputError as exc:
            findings.append(Finding("serve-config", exc.problem, exc.file, exc.field, exc.fix))
    return findings + validate_objects(rendered.objects, schema_dir, rendered.file)


def load_release(overlay: str | None, manifest: str | None) -> Rendered:
    """An overlay (rendered now) or an already rendered manifest file ('-' for stdin)."""
    if manifest is not None:
        return load_manifest(manifest)
    if overlay is None:
        raise InputError("", "", "nothing to check", "pass an overlay directory or -f FILE")
    path = Path(overlay)
    if path.is_file():
        return load_manifest(overlay)
    if not path.is_dir():
        raise InputError(overlay, "", "no such overlay directory", "pass e.g. overlays/local")
    return render(path)


def blocking(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
