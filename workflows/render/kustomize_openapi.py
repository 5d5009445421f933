"""The OpenAPI document kustomize needs to strategic-merge RayService worker groups by groupName.

Kustomize only knows merge keys of built-in kinds; given a custom schema it uses that alone, so
the document carries the Pod template types too (taken from kubernetes-validate's pinned
Kubernetes schemas) and the RayService path down to them. Committed as
kustomize/openapi/rayservice.json; tests fail when it drifts from this generator.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

K8S_VERSION = "1.37.0"
_ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
_KEEP = {"type", "items", "properties", "additionalProperties", "$ref",
         "x-kubernetes-patch-merge-key", "x-kubernetes-patch-strategy", "x-kubernetes-group-version-kind"}


def _k8s_definitions() -> dict[str, Any]:
    import kubernetes_validate

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{K8S_VERSION}-local"
    return json.loads((base / "_definitions.json").read_text())["$defs"]


def _slim(node: Any) -> Any:
    if isinstance(node, list):
        return [_slim(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEEP:
            continue
        if key == "$ref":
            value = value.replace("#/$defs/", "#/definitions/")
        elif key == "type" and isinstance(value, list):
            value = next(t for t in value if t != "null")
        elif key == "properties":
            value = {k: _slim(v) for k, v in value.items()}
        else:
            value = _slim(value)
        out[key] = value
    return out


def _closure(defs: dict[str, Any], root: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = _slim(defs[name])
        todo.extend(ref.split("/")[-1] for ref in _refs(seen[name]))
    return seen


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/{name}"}


def build_document() -> dict[str, Any]:
    defs = _closure(_k8s_definitions(), _ROOT)
    defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"] = {"type": "object"}
    defs.update({
        "io.ray.v1.RayService": {
            "type": "object",
            "x-kubernetes-group-version-kind": [{"group": "ray.io", "kind": "RayService", "version": "v1"}],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                           "spec": _ref("io.ray.v1.RayServiceSpec")},
        },
        "io.ray.v1.RayServiceSpec": {"type": "object",
                                     "properties": {"rayClusterConfig": _ref("io.ray.v1.RayClusterSpec")}},
        "io.ray.v1.RayClusterSpec": {"type": "object", "properties": {
            "headGroupSpec": _ref("io.ray.v1.HeadGroupSpec"),
            "workerGroupSpecs": {"type": "array", "items": _ref("io.ray.v1.WorkerGroupSpec"),
                                 "x-kubernetes-patch-merge-key": "groupName",
                                 "x-kubernetes-patch-strategy": "merge"}}},
        "io.ray.v1.HeadGroupSpec": {"type": "object", "properties": {"template": _ref(_ROOT)}},
        "io.ray.v1.WorkerGroupSpec": {"type": "object",
                                      "properties": {"groupName": {"type": "string"}, "template": _ref(_ROOT)}},
    })
    return {"swagger": "2.0", "info": {"title": "pdops RayService merge keys", "version": K8S_VERSION},
            "paths": {}, "definitions": dict(sorted(defs.items()))}


def render_document() -> str:
    return json.dumps(build_document(), indent=1, sort_keys=True) + "\n"
