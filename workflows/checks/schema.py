"""Validate rendered Kubernetes objects against pinned upstream schemas, offline.

Custom resources are checked against their CRD in strict mode (unknown fields are errors, as
with `kubectl apply --validate=strict`) including the CRD's CEL rules; Argo Events kinds against
Argo Events' schema.json, because their CRDs are schemaless; core kinds with kubernetes-validate.
"""
from __future__ import annotations

import difflib
import functools
import itertools
import json
import os
import re
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from workflows.checks.findings import Finding
from workflows.errors import InputError
from workflows.render import cache

K8S_VERSION = "1.37.0"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads a 2.5 MB CRD ~10x faster
# JSON Schema keywords kept from a CRD node; descriptions, defaults and formats are dropped.
_KEEP = {"$ref", "type", "enum", "const", "pattern", "required", "minimum", "maximum", "multipleOf",
         "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
# CRDs do not describe metadata; the API server does, and only a name is needed here.
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}


# The pinned upstream CRD and JSON schemas travel with the package (workflows/data/schemas, Apache-2.0
# data; sources and tags in its README.md, refreshed by scripts/refresh_schemas.py), so a clone or
# the step image's non-editable install checks offline with no setting and nothing beside it.
PINNED_SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def schema_dir_from_env() -> Path:
    """PDOPS_SCHEMA_DIR when set (an override: other copies of the schemas), else the pinned ones."""
    return Path(os.environ.get("PDOPS_SCHEMA_DIR") or PINNED_SCHEMAS)


def validate_objects(objects: list[dict], schema_dir: Path, file: str) -> list[Finding]:
    """Findings (rule "schema") for every object in a rendered manifest; [] when all are valid."""
    schema_dir = Path(schema_dir)
    if not schema_dir.is_dir():
        raise InputError(file=str(schema_dir), field="", problem="schema folder not found",
                         fix="unset PDOPS_SCHEMA_DIR / drop --schema-dir to use the pinned schemas in "
                             "workflows/data/schemas, or point them at a folder laid out like it")
    return [f for obj in objects for f in _validate(obj, schema_dir.resolve(), file)]


def _validate(obj: dict, schema_dir: Path, file: str) -> list[Finding]:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    meta = obj.get("metadata")
    label = f"{kind}/{meta.get('name', '?') if isinstance(meta, dict) else '?'}"
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [Finding("schema", "object has no apiVersion or kind", file, label,
                        "set apiVersion and kind")]
    group, _, version = api_version.rpartition("/")
    events = group == "argoproj.io" and version == "v1alpha1"
    validator = ((events and _events_validator(schema_dir, kind))
                 or _crd_validator(schema_dir, group, kind, version))
    if validator is not None:
        errors: Iterable[jsonschema.ValidationError] = validator.iter_errors(obj)
    else:
        core = _k8s_validator(api_version, kind)
        if core is None:
            return [Finding("schema", f"no pinned schema for {api_version} {kind}; not validated",
                            file, label, severity="info")]
        errors = list(itertools.islice(core.iter_errors(obj), 1))  # kubernetes-validate stops at the first error
    findings = [f for err in errors for f in _findings(err, label, file)]
    return sorted(findings, key=lambda f: (f.field, f.message))


@functools.cache
def _k8s_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    """What kubernetes_validate.validate(obj, K8S_VERSION, strict=True) checks (the same files, a
    Draft 2020-12 validator with its definitions in the registry: kubernetes_validate/utils.py
    validate()), built once per kind: it re-reads its 1.8 MB _definitions.json and lists its 5,000
    schema files on every call, 0.07 s per object."""
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    version = [v for v in utils.all_versions() if utils.major_minor(v) <= utils.major_minor(K8S_VERSION)][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    name = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{name}.json", K8S_VERSION)
    except FileNotFoundError:
        return None
    registry = _k8s_definitions(folder) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _k8s_definitions(folder: str) -> Any:
    from kubernetes_validate import utils
    from referencing import Resource

    return Resource.from_contents(utils.schema_contents(f"{folder}/_definitions.json", K8S_VERSION))


def _findings(err: jsonschema.ValidationError, label: str, file: str) -> Iterator[Finding]:
    """One finding per error, and one per unknown field so each has its own path and fix."""
    if err.validator == "additionalProperties" and isinstance(err.instance, dict) and isinstance(err.schema, dict):
        known = list(err.schema.get("properties", {}))
        for name in err.instance:
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1)
                fix = f"remove or fix the spelling of `{name}`" + (f" (did you mean `{near[0]}`?)" if near else "")
                yield Finding("schema", f"unknown field `{name}`", file, _field(label, [*err.absolute_path, name]), fix)
        return
    yield Finding("schema", textwrap.shorten(err.message, 300), file, _field(label, err.absolute_path), _fix(err))


def _field(label: str, path: Iterable[str | int]) -> str:
    """'Kind/name spec.list[0].key', the form every finding uses."""
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return f"{label} {dotted}".rstrip()


def _fix(err: jsonschema.ValidationError) -> str:
    value: Any = err.validator_value   # its type depends on the keyword (`type`: str or list, `enum`: list)
    if err.validator == "type":
        return "use a value of type " + " or ".join([value] if isinstance(value, str) else value)
    if err.validator == "enum":
        return "use one of " + ", ".join(map(json.dumps, value))
    return {"required": "add the missing field",
            "pattern": f"use a value matching `{value}`",
            "x-kubernetes-validations": f"make the value satisfy the CEL rule `{value}`",
            }.get(str(err.validator), "")


@functools.cache
def _cel_program(rule: str) -> Any:
    import cel  # 0.2 s to import (it loads its CLI): only when a CEL rule is evaluated

    return cel.compile(rule)


def _cel_rules(validator: Any, rules: list[dict], instance: Any, schema: dict
               ) -> Iterator[jsonschema.ValidationError]:
    """The CRD's x-kubernetes-validations, evaluated with `self` bound to the value at this node."""
    for rule in rules:
        try:
            ok = _cel_program(rule["rule"]).execute({"self": instance})
        except Exception:  # noqa: BLE001 - Python CEL lacks some Kubernetes CEL extensions: skip rather than guess
            continue
        if ok is False:
            yield jsonschema.ValidationError(rule.get("message") or f"failed CEL rule {rule['rule']}",
                                             validator="x-kubernetes-validations", validator_value=rule["rule"])


_CrdValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                             {"x-kubernetes-validations": _cel_rules})


def _convert(node: dict) -> dict:
    """A CRD openAPIV3Schema node as strict JSON Schema (also used for Argo Events' schema.json)."""
    out = {k: v for k, v in node.items() if k in _KEEP}
    if "properties" in node:
        out["properties"] = {name: _convert(sub) for name, sub in node["properties"].items()}
    for key in ("items", "not"):
        if key in node:
            out[key] = _convert(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [_convert(sub) for sub in node[key]]
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = _convert(extra)
    elif extra is not None:
        out["additionalProperties"] = extra
    elif "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    rules = [r for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"]]
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


@functools.cache
def _crd_files(schema_dir: Path) -> dict[tuple[str, str], Path]:
    """(group, kind) -> CRD file, read from each file's head only: full CRDs are megabytes."""
    index = {}
    for path in sorted(schema_dir.glob("*/*.yaml")):
        with path.open() as f:
            head = "".join(itertools.takewhile(lambda line: not line.startswith("  versions:"), f))
        head = yaml.load(head, Loader=_LOADER)
        if isinstance(head, dict) and head.get("kind") == "CustomResourceDefinition":
            index[(head["spec"]["group"], head["spec"]["names"]["kind"])] = path
    return index


@functools.cache
def _crd_validator(schema_dir: Path, group: str, kind: str, version: str
                   ) -> jsonschema.protocols.Validator | None:
    path = _crd_files(schema_dir).get((group, kind))
    if path is None:
        return None
    schema = _crd_schema(path, version)
    return None if schema is None else _CrdValidator(schema)


class _CrdSchema(cache.Entry):
    json_schema: dict[str, Any] | None   # None: the CRD has no such version


def _crd_schema(path: Path, version: str) -> dict[str, Any] | None:
    """One version of a CRD as strict JSON Schema. Parsing the 1 MB RayService CRD and converting it
    takes 0.23 s, reading the cached result 0.02 s: it is cached by the digests of the CRD file and
    of this converter."""
    key = cache.digest("crd-schema", cache.file_digest(path), cache.file_digest(Path(__file__)), version)
    if key is not None and (hit := cache.read("crd-schemas", key, _CrdSchema)) is not None:
        return hit.json_schema
    crd = yaml.load(path.read_text(), Loader=_LOADER)
    schema = None
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = _convert(entry["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = _METADATA
            break
    if key is not None:
        cache.write("crd-schemas", _CrdSchema(key=key, json_schema=schema))
    return schema


@functools.cache
def _events_definitions(schema_dir: Path) -> dict[str, dict]:
    """Argo Events' schema.json definitions, made strict like the CRDs."""
    path = next(schema_dir.glob("argo-events-*/schema.json"), None)
    definitions = json.loads(path.read_text())["definitions"] if path else {}
    return {name: _convert(sub) for name, sub in definitions.items()}


@functools.cache
def _events_validator(schema_dir: Path, kind: str) -> jsonschema.protocols.Validator | None:
    name = f"io.argoproj.events.v1alpha1.{kind}"
    definitions = _events_definitions(schema_dir)
    if name not in definitions:
        return None
    return jsonschema.Draft202012Validator({"$ref": f"#/definitions/{name}", "definitions": definitions})
