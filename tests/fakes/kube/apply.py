"""Server-side apply and field ownership (managedFields), as structured-merge-diff does it for what pdops sends.

Modelled (k8s.io/apiserver pkg/endpoints/handlers/fieldmanager, sigs.k8s.io/structured-merge-diff):
- every write records which manager set which fields (`metadata.managedFields`, FieldsV1 form):
  an Update takes the fields it changed away from other managers; an Apply owns exactly the
  fields of its configuration;
- apply creates a missing object; fields the same manager applied before and leaves out now are
  removed (unless another manager also owns them);
- a field another manager owns with a different value is a conflict (409, "Apply failed with N
  conflicts: conflict with "kuberay-operator" ...") unless `force=true`, which takes ownership;
  equal values become co-owned;
- metadata.resourceVersion in an applied configuration is a precondition.
Simplified: lists are atomic (the real schema merges `containers` by name and `finalizers` as a
set); pdops applies whole lists and never shares one with another manager, so the difference
does not show.
"""
from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

Path = tuple[str, ...]
IGNORED_META = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                "deletionTimestamp", "deletionGracePeriodSeconds", "generateName", "selfLink"}


def leaves(obj: dict[str, Any], subresource: str = "") -> dict[Path, Any]:
    """Owned leaf paths of an object (status only for the status subresource; none of it otherwise)."""
    out: dict[Path, Any] = {}

    def walk(value: Any, path: Path) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, path + (k,))
        else:
            out[path] = value
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if (key == "status") != (subresource == "status"):
            continue
        if key == "metadata":
            for mk, mv in (value or {}).items():
                if mk not in IGNORED_META:
                    walk(mv, ("metadata", mk))
        else:
            walk(value, (key,))
    return out


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return root


def _paths(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, child in fields.items():
        if key == ".":
            continue
        path = prefix + (key[2:],)
        out |= _paths(child, path) if child else {path}
    return out


def _entries(meta: dict) -> list[dict[str, Any]]:
    return [dict(e, paths=_paths(e.get("fieldsV1") or {})) for e in meta.get("managedFields") or []]


def _store(meta: dict, entries: list[dict[str, Any]]) -> None:
    time = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for e in entries:
        if not e["paths"]:
            continue
        entry = {k: v for k, v in e.items() if k not in ("paths", "fieldsV1")}
        entry.setdefault("time", time)
        out.append({**entry, "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(e["paths"])})
    meta["managedFields"] = out


def _entry(entries: list[dict], manager: str, operation: str, api_version: str, subresource: str) -> dict:
    for e in entries:
        if (e["manager"], e["operation"], e.get("subresource", "")) == (manager, operation, subresource):
            return e
    e = {"manager": manager, "operation": operation, "apiVersion": api_version, "paths": set()}
    if subresource:
        e["subresource"] = subresource
    entries.append(e)
    return e


def record_update(meta: dict, old: dict, new: dict, manager: str, api_version: str, operation: str,
                  subresource: str = "") -> None:
    """An Update by `manager`: it owns what it changed; others lose it."""
    before, after = leaves(old, subresource) if old else {}, leaves(new, subresource)
    changed = {p for p in set(before) | set(after) if before.get(p, _MISSING) != after.get(p, _MISSING)}
    entries = _entries(old.get("metadata") or {}) if old else []
    for e in entries:
        e["paths"] -= changed
    _entry(entries, manager, operation, api_version, subresource)["paths"] |= {p for p in changed if p in after}
    _store(meta, entries)


_MISSING = object()


def _get(obj: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _set(obj: dict, path: Path, value: Any) -> None:
    for part in path[:-1]:
        if not isinstance(obj.get(part), dict):
            obj[part] = {}
        obj = obj[part]
    obj[path[-1]] = copy.deepcopy(value)


def _unset(obj: dict, path: Path) -> None:
    parents = [obj]
    for part in path[:-1]:
        obj = obj.get(part) if isinstance(obj, dict) else None
        if not isinstance(obj, dict):
            return
        parents.append(obj)
    parents[-1].pop(path[-1], None)
    for parent, part in zip(reversed(parents[:-1]), reversed(path[:-1])):  # drop maps left empty
        if parent.get(part) == {}:
            parent.pop(part)


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[tuple[str, str, Path]]) -> None:
        self.conflicts = conflicts
        n = len(conflicts)
        super().__init__(f"Apply failed with {n} conflict{'s' if n > 1 else ''}: " + "\n".join(
            f'conflict with "{m}" using {v}: .{".".join(p)}' for m, v, p in conflicts))


def apply(old: dict | None, config: dict, manager: str, force: bool, api_version: str) -> dict[str, Any]:
    """The object after `manager` applies `config` over `old` (None: create)."""
    wanted = leaves(config)
    if old is None:
        new = copy.deepcopy(config)
        new.pop("status", None)
        meta = new.setdefault("metadata", {})
        _store(meta, [{"manager": manager, "operation": "Apply", "apiVersion": api_version, "paths": set(wanted)}])
        return new
    entries = _entries(old["metadata"])
    mine = _entry(entries, manager, "Apply", api_version, "")
    conflicts = []
    for e in entries:
        if e is mine or e.get("subresource"):
            continue
        clash = {p for p in e["paths"] if p in wanted and _get(old, p) != wanted[p]}
        clash |= {p for p in e["paths"] for w in wanted if p != w and (p[:len(w)] == w or w[:len(p)] == p)}
        if clash and not force:
            conflicts += [(e["manager"], e["apiVersion"], p) for p in sorted(clash)]
        e["paths"] -= clash
    if conflicts:
        raise ApplyConflict(conflicts)
    new = copy.deepcopy(old)
    others = set().union(*(e["paths"] for e in entries if e is not mine))
    for path in mine["paths"] - set(wanted) - others:  # dropped from this manager's configuration
        _unset(new, path)
    for path, value in wanted.items():
        _set(new, path, value)
    mine["paths"] = set(wanted)
    if config.get("metadata", {}).get("resourceVersion"):
        new["metadata"]["resourceVersion"] = config["metadata"]["resourceVersion"]
    else:
        new["metadata"].pop("resourceVersion", None)
    _store(new["metadata"], entries)
    return new
