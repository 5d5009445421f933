"""An on-disk cache of results computed from pinned inputs, so a repeated `pdops check` is fast.

Importing Ray Serve LLM's config models (they import vLLM and torch) takes 9-16 s on a 2-core
machine; validating a serve config with them takes milliseconds. Their verdict depends only on the
config and the installed versions, so it is kept here keyed by both (`serve_config.py`); Ray's
models still decide every config they have not seen. Converted CRD schemas are kept the same way,
keyed by the CRD file's digest (`checks/schema.py`).

Entries are JSON files named by the SHA-256 of their key. They are written to a temporary file
and renamed into place (atomic on POSIX), so concurrent writers never leave half a file; an entry
that does not parse as its model, or names another key, is ignored as a miss.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

FORMAT = 1   # bump when an entry's meaning changes: old entries then miss
M = TypeVar("M", bound=BaseModel)


def cache_dir() -> Path:
    """PDOPS_CACHE_DIR, else PDOPS_HOME/cache, else $XDG_CACHE_HOME/pdops (default ~/.cache/pdops)."""
    if os.environ.get("PDOPS_CACHE_DIR"):
        return Path(os.environ["PDOPS_CACHE_DIR"])
    if os.environ.get("PDOPS_HOME"):
        return Path(os.environ["PDOPS_HOME"]) / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdops"


def enabled() -> bool:
    return os.environ.get("PDOPS_NO_CACHE", "") in ("", "0")


@cache
def version(distribution: str) -> str:
    """A distribution's version from its metadata, without importing it ('' when not installed)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def digest(*parts: object) -> str | None:
    """SHA-256 of the parts as canonical JSON (sorted keys: dict order does not change a key).

    None when the parts are not plain JSON data (a YAML date, an integer mapping key, NaN): JSON
    would make them look like other values that Ray may judge differently, so they are not cached."""
    try:
        text = json.dumps([FORMAT, *parts], sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    if json.loads(text) != [FORMAT, *parts]:   # tuples, integer keys: JSON would change them
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _path(namespace: str, key: str) -> Path:
    return cache_dir() / namespace / f"{key}.json"


class Entry(BaseModel):
    key: str   # the entry's own key: a file copied or renamed under another name is a miss


def read(namespace: str, key: str, model: type[M]) -> M | None:
    """The cached entry, or None on a miss, a corrupt or foreign file, or a disabled cache."""
    if not enabled():
        return None
    try:
        entry = model.model_validate_json(_path(namespace, key).read_bytes())
    except (OSError, ValidationError, ValueError):
        return None
    return entry if getattr(entry, "key", None) == key else None


def write(namespace: str, entry: Entry) -> None:
    """Store an entry atomically; a cache that cannot be written only costs speed."""
    if not enabled():
        return
    path = _path(namespace, entry.key)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{entry.key[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(entry.model_dump_json())
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
