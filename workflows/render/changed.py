"""Which overlays a set of changed files affects: what `pdops check --changed FILE...` checks (the
pre-commit hook in .pre-commit-hooks.yaml passes the files a commit touches).

  a file under kustomize/            every overlay (bases, components and the shared merge-key schema)
  a file in overlays/NAME/           overlay NAME
  any file an overlay's kustomizations name (another overlay's patch, say)   that overlay too
  anything else (README.md, code)    no overlay
"""
from __future__ import annotations

import os
from pathlib import Path

from workflows.errors import InputError
from workflows.render.manifest import KUSTOMIZATION_FILES, check_references, repository_root


def overlays_of(root: Path) -> list[Path]:
    """The overlays of a repository: overlays/NAME folders holding a kustomization."""
    folder = root / "overlays"
    if not folder.is_dir():
        return []
    return sorted(d for d in folder.iterdir() if d.is_dir() and any((d / n).is_file() for n in KUSTOMIZATION_FILES))


def _inputs(overlay: Path) -> set[Path]:
    """Every file the overlay's kustomizations read; empty when they are broken (checking the
    overlay will say how)."""
    try:
        return set(check_references(overlay))
    except InputError:
        return set()


def affected_overlays(files: list[str], cwd: Path | None = None) -> list[Path]:
    """The overlays to check for these changed files (paths relative to cwd, as pre-commit passes
    them from the repository root), as paths relative to cwd where possible, sorted."""
    cwd = Path(cwd or Path.cwd())
    affected: set[Path] = set()
    inputs: dict[Path, set[Path]] = {}
    for name in files:
        given = cwd / name
        path = given.parent.resolve() / given.name   # a deleted file counts too; a symlink is its own name
        root = repository_root(path.parent if path.parent.exists() else cwd)
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            continue
        overlays = overlays_of(root)
        if parts[:1] == ("kustomize",):
            affected.update(overlays)
            continue
        if parts[:1] == ("overlays",) and len(parts) > 2:
            affected.update(o for o in overlays if o.name == parts[1])
        for overlay in overlays:
            if overlay not in affected:
                if overlay not in inputs:
                    inputs[overlay] = _inputs(overlay)
                if path in inputs[overlay] or path.resolve() in inputs[overlay]:
                    affected.add(overlay)
    return sorted(Path(os.path.relpath(o, cwd)) if o.is_relative_to(cwd) else o for o in affected)
