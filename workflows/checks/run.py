"""Every check on a rendered release: the cross-layer rules (workflows/checks/rules.py and the
rule modules it registers), Ray's own validation of a manifest file's serve config, and the
pinned upstream schemas. What `pdops check`, `pdops render`, `pdops advise` and the release run.
"""
from __future__ import annotations

from pathlib import Path

from workflows.checks.findings import Finding
from workflows.checks.rules import lint
from workflows.checks.schema import validate_objects
from workflows.errors import InputError
from workflows.render.manifest import Rendered
from workflows.render.serve_config import validate_with_ray


def check_rendered(rendered: Rendered, schema_dir: Path) -> list[Finding]:
    """Every finding for a rendered release: cross-layer rules, then the pinned schemas."""
    findings = lint(rendered)
    if rendered.overlay is None and rendered.serve_config:
        # An overlay's serve config was validated by Ray while rendering; a file's was not.
        try:
            validate_with_ray(rendered.serve_config, rendered.file)
        except InputError as exc:
            findings.append(Finding("serve-config", exc.problem, exc.file, exc.field, exc.fix))
    return findings + validate_objects(rendered.objects, schema_dir, rendered.file)


def blocking(findings: list[Finding]) -> list[Finding]:
    """The findings that block (errors; warnings are reported only)."""
    return [f for f in findings if f.severity == "error"]


# ---- the release: rollout -> validate -> gate -> promote | rollback --------------------------------
