"""Cross-layer lint: rules that need the serve config, the RayService and the node groups at once.

Each rule reads the rendered release only (so `check -f manifest.yaml` runs them too) and names
the file a person edits: release.yaml for serve-config fields, the kustomization for the rest.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from workflows.checks.findings import Finding
from workflows.manifest import MAX_POSITIONS_ANNOTATION, Rendered
from workflows.serve_config import KV_ROLE, PHASE_RESOURCE, PHASES, app_args

GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
EFA_TAINTS = ("vpc.amazonaws.com/efa", "aws.amazon.com/efa")
Rule = Callable[[Rendered], Iterator[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


# ---- accessors -------------------------------------------------------------------------------

def _args(r: Rendered) -> dict[str, Any]:
    return app_args(r.serve_config)


def _phase(r: Rendered, name: str) -> dict[str, Any]:
    cfg = _args(r).get(f"{name}_config")
    return cfg if isinstance(cfg, dict) else {}


def _engine(r: Rendered, name: str) -> dict[str, Any]:
    return _phase(r, name).get("engine_kwargs") or {}


def _kv(r: Rendered, name: str) -> dict[str, Any] | None:
    return _engine(r, name).get("kv_transfer_config")


def _tp(r: Rendered, name: str) -> int:
    return int(_engine(r, name).get("tensor_parallel_size") or 1)


def _pp(r: Rendered, name: str) -> int:
    return int(_engine(r, name).get("pipeline_parallel_size") or 1)


def _nodes_per_replica(r: Rendered, name: str) -> int:
    """Worker pods one replica of `name` spans: TP x PP GPUs over the group's GPUs per pod (1 on CPU
    or when the pod requests no GPUs, which gpu-fit reports)."""
    group = _groups(r).get(name, (0, {}))[1]
    gpus = int(_limit(group, GPU))
    devices = _tp(r, name) * _pp(r, name)
    return 1 if gpus <= 0 or devices <= gpus else -(-devices // gpus)


def _max_serve_replicas(r: Rendered, name: str) -> int:
    dc = _phase(r, name).get("deployment_config") or {}
    auto = dc.get("autoscaling_config") or {}
    return int(auto.get("max_replicas") or dc.get("num_replicas") or 1)


def _rs_name(r: Rendered) -> str:
    return f"RayService/{(r.rayservice or {}).get('metadata', {}).get('name', '?')}"


def _cluster(r: Rendered) -> dict[str, Any]:
    return ((r.rayservice or {}).get("spec") or {}).get("rayClusterConfig") or {}


def _groups(r: Rendered) -> dict[str, tuple[int, dict[str, Any]]]:
    return {g.get("groupName"): (i, g) for i, g in enumerate(_cluster(r).get("workerGroupSpecs") or [])}


def _group_path(r: Rendered, index: int) -> str:
    return f"{_rs_name(r)} spec.rayClusterConfig.workerGroupSpecs[{index}]"


def _serve_path(name: str, rest: str) -> str:
    return f"serveConfigV2.applications[0].args.{name}_config.{rest}"


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_spec.get("containers") or [])


def _limit(group: dict[str, Any], resource: str) -> float:
    total = 0.0
    for c in _containers((group.get("template") or {}).get("spec") or {}):
        value = ((c.get("resources") or {}).get("limits") or {}).get(resource)
        total += float(value) if value is not None else 0.0
    return total


def _env(group: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in _containers((group.get("template") or {}).get("spec") or {}):
        out.update({e.get("name"): e.get("value") for e in c.get("env") or []})
    return out


def _ray_resources(group: dict[str, Any]) -> dict[str, Any] | None:
    raw = (group.get("rayStartParams") or {}).get("resources")
    if raw is None:
        return None
    try:
        value = json.loads(raw)
        value = json.loads(value) if isinstance(value, str) else value  # KubeRay quotes it twice
        return value if isinstance(value, dict) else None
    except (TypeError, ValueError):
        return None


def _serve_file(r: Rendered) -> str:
    return r.spec_file()


# ---- serve-config rules ----------------------------------------------------------------------

@rule
def model_mismatch(r: Rendered) -> Iterator[Finding]:
    ids = {n: (_phase(r, n).get("model_loading_config") or {}).get("model_id") for n in PHASES}
    if ids["prefill"] != ids["decode"]:
        yield Finding("model-mismatch", f"prefill serves {ids['prefill']!r} but decode serves {ids['decode']!r}",
                      _serve_file(r), _serve_path("decode", "model_loading_config.model_id"),
                      "both phases must serve the same model: remove per-phase model overrides in release.yaml")


@rule
def kv_role(r: Rendered) -> Iterator[Finding]:
    for name in PHASES:
        kv = _kv(r, name)
        if not isinstance(kv, dict):
            continue  # kv-connector reports the missing config
        role, want = kv.get("kv_role"), KV_ROLE[name]
        field = _serve_path(name, "engine_kwargs.kv_transfer_config.kv_role")
        if role is None:
            yield Finding("kv-role", f"{name} has no kv_role", _serve_file(r), field, f"set kv_role: {want}")
        elif role == "kv_both":
            yield Finding("kv-role", f"{name} uses the deprecated kv_role kv_both", _serve_file(r), field,
                          f"use kv_role: {want} ({name} {'produces' if name == 'prefill' else 'consumes'} KV)")
        elif role != want:
            yield Finding("kv-role", f"{name} has kv_role {role!r}; prefill/decode roles are swapped or wrong",
                          _serve_file(r), field, f"set kv_role: {want}")


# vLLM connectors that run in P/D configs without error but do not hand prefill's KV to decode.
NOT_PD_CONNECTORS = {
    "DecodeBenchConnector": "decode fills its KV cache with dummy values (a benchmark tool)",
    "ExampleConnector": "an example that saves and loads KV through local files on one node",
    "OffloadingConnector": "it offloads one engine's KV to CPU memory",
    "SimpleCPUOffloadConnector": "it offloads one engine's KV to CPU memory",
}


@rule
def kv_connector(r: Rendered) -> Iterator[Finding]:
    kvs = {n: _kv(r, n) for n in PHASES}
    for name, kv in kvs.items():
        if not isinstance(kv, dict) or not kv.get("kv_connector"):
            yield Finding("kv-connector", f"{name} has no kv_transfer_config.kv_connector: KV cannot move",
                          _serve_file(r), _serve_path(name, "engine_kwargs.kv_transfer_config"),
                          "set kv_transfer.connector in release.yaml (NixlConnector)")
    p, d = kvs["prefill"], kvs["decode"]   # PHASES
    if isinstance(p, dict) and isinstance(d, dict) and p.get("kv_connector") and d.get("kv_connector"):
        why = NOT_PD_CONNECTORS.get(p["kv_connector"])
        if why:
            yield Finding("kv-connector", f"{p['kv_connector']} does not move KV from prefill to decode: {why}; "
                          "the golden-token check will fail such a candidate", _serve_file(r),
                          _serve_path("prefill", "engine_kwargs.kv_transfer_config.kv_connector"),
                          "set kv_transfer.connector in release.yaml to a P/D transport (NixlConnector)",
                          severity="warning")
        if p["kv_connector"] != d["kv_connector"]:
            yield Finding("kv-connector", f"prefill uses {p['kv_connector']} but decode uses {d['kv_connector']}",
                          _serve_file(r), _serve_path("decode", "engine_kwargs.kv_transfer_config.kv_connector"),
                          "use one connector for both phases (kv_transfer.connector)")
        pb = (p.get("kv_connector_extra_config") or {}).get("backends")
        db = (d.get("kv_connector_extra_config") or {}).get("backends")
        if pb != db:
            yield Finding("kv-connector", f"NIXL backends differ: prefill {pb}, decode {db}", _serve_file(r),
                          _serve_path("decode", "engine_kwargs.kv_transfer_config.kv_connector_extra_config.backends"),
                          "use the same kv_transfer.backends for both phases")


@rule
def tp_order(r: Rendered) -> Iterator[Finding]:
    if _tp(r, "prefill") > _tp(r, "decode"):
        yield Finding("tp-order",
                      f"prefill tensor_parallel_size {_tp(r, 'prefill')} exceeds decode's {_tp(r, 'decode')}",
                      _serve_file(r), _serve_path("prefill", "engine_kwargs.tensor_parallel_size"),
                      "vLLM's heterogeneous-TP KV transfer needs prefill TP <= decode TP: "
                      "lower prefill or raise decode")


@rule
def max_model_len(r: Rendered) -> Iterator[Finding]:
    known = ((r.rayservice or {}).get("metadata", {}).get("annotations") or {}).get(MAX_POSITIONS_ANNOTATION)
    if not known:
        return
    for name in PHASES:
        mml = _engine(r, name).get("max_model_len")
        if mml is not None and int(mml) > int(known):
            yield Finding("max-model-len", f"{name} max_model_len {mml} exceeds the model's limit {known}",
                          _serve_file(r), _serve_path(name, "engine_kwargs.max_model_len"),
                          f"set model.max_model_len <= {known}")


# ---- RayService / node-group rules -----------------------------------------------------------

@rule
def placement(r: Rendered) -> Iterator[Finding]:
    groups = _groups(r)
    for name in PHASES:
        res = PHASE_RESOURCE[name]
        if name not in groups:
            yield Finding("placement", f"no worker group named {name!r}", r.kustomization_file(),
                          f"{_rs_name(r)} spec.rayClusterConfig.workerGroupSpecs",
                          "keep the base's prefill and decode groups; patch them by groupName")
            continue
        index, group = groups[name]
        advertised = _ray_resources(group) or {}
        if not advertised.get(res):
            yield Finding("placement", f"worker group {name!r} does not advertise the Ray resource {res!r}, so "
                          f"{name} replicas may land on any node", r.kustomization_file(),
                          _group_path(r, index) + ".rayStartParams.resources",
                          f"set rayStartParams.resources to '\"{{\\\"{res}\\\": 1}}\"' (as in kustomize/base)")
        bundle = (_phase(r, name).get("placement_group_config") or {}).get("bundle_per_worker") or {}
        bundles = (_phase(r, name).get("placement_group_config") or {}).get("bundles") or [bundle]
        if not all(b.get(res) for b in bundles):
            yield Finding("placement", f"{name} placement bundles do not request {res!r}: the phase is not pinned "
                          "to its worker group", _serve_file(r), _serve_path(name, "placement_group_config"),
                          "do not override placement_group_config in release.yaml")


@rule
def gpu_fit(r: Rendered) -> Iterator[Finding]:
    if any((_phase(r, n).get("accelerator_config") or {}).get("kind") == "cpu" for n in PHASES):
        return
    groups = _groups(r)
    for name in PHASES:
        if name not in groups:
            continue
        index, group = groups[name]
        gpus = _limit(group, GPU)
        tp, replicas = _tp(r, name), _max_serve_replicas(r, name)
        pods = int(group.get("maxReplicas") or 0)
        field = _group_path(r, index) + f".template.spec.containers[0].resources.limits.{GPU}"
        if gpus <= 0:
            yield Finding("gpu-fit", f"worker group {name!r} requests no GPUs but serves a GPU engine",
                          r.kustomization_file(), field, f"set limits {GPU} on the {name} group's container")
        elif tp > gpus:   # TP all-reduces every layer: it stays within a node; PP is what crosses nodes
            yield Finding("gpu-fit", f"{name} tensor_parallel_size {tp} does not fit one {name} pod ({gpus:g} GPUs)",
                          r.kustomization_file(), field, "lower tensor_parallel_size or use a larger instance type "
                          "(a model that needs more GPUs spans nodes with pipeline_parallel_size)")
        elif (nodes := _nodes_per_replica(r, name)) > 1:
            if replicas * nodes > pods:   # a spanning replica takes whole pods (rule pp-gpus)
                yield Finding("gpu-fit", f"{name} needs {replicas} replicas x {nodes} nodes per replica (TP {tp} x PP "
                              f"{_pp(r, name)} = {tp * _pp(r, name)} GPUs over {gpus:g}-GPU pods) = {replicas * nodes} "
                              f"pods but the group offers at most {pods}", r.kustomization_file(),
                              _group_path(r, index) + ".maxReplicas",
                              f"set the {name} group's replicas, minReplicas and maxReplicas to {replicas * nodes}")
        elif replicas * tp * _pp(r, name) > pods * gpus:
            per = f"TP {tp}" if _pp(r, name) == 1 else f"TP {tp} x PP {_pp(r, name)}"
            need = replicas * tp * _pp(r, name)
            yield Finding("gpu-fit", f"{name} needs {replicas} replicas x {per} = {need} GPUs but the group "
                          f"offers at most {pods} pods x {gpus:g} GPUs = {pods * gpus:g}", r.kustomization_file(),
                          _group_path(r, index) + ".maxReplicas",
                          f"raise maxReplicas to {-(-need // int(gpus))} or lower {name} replicas")


@rule
def efa(r: Rendered) -> Iterator[Finding]:
    for name, (index, group) in _groups(r).items():
        if name not in PHASES:
            continue
        efa_limit = _limit(group, EFA) > 0
        on_efa = efa_limit or _env(group).get("FI_PROVIDER") == "efa"
        backends = ((_kv(r, name) or {}).get("kv_connector_extra_config") or {}).get("backends") or ["UCX"]
        if on_efa and "LIBFABRIC" not in backends:
            yield Finding("efa-backend", f"{name} runs on EFA nodes but NIXL backends are {backends}: NIXL silently "
                          "falls back to TCP (TTFT ~100x worse, no error)", _serve_file(r),
                          _serve_path(name, "engine_kwargs.kv_transfer_config.kv_connector_extra_config.backends"),
                          "set kv_transfer.backends: [LIBFABRIC] in release.yaml")
        if "LIBFABRIC" in backends or on_efa:
            pod = (group.get("template") or {}).get("spec") or {}
            tolerated = {t.get("key") for t in pod.get("tolerations") or []}
            if not efa_limit:
                yield Finding("efa-resource", f"{name} uses EFA (LIBFABRIC/FI_PROVIDER) but requests no {EFA}",
                              r.kustomization_file(),
                              _group_path(r, index) + f".template.spec.containers[0].resources.limits.{EFA}",
                              "add the efa component (kustomize/components/efa) to the overlay")
            elif not tolerated.intersection(EFA_TAINTS):
                yield Finding("efa-resource", f"{name} requests EFA but does not tolerate the EFA node taint",
                              r.kustomization_file(), _group_path(r, index) + ".template.spec.tolerations",
                              "add the efa component (kustomize/components/efa) to the overlay")


_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


def _all_containers(r: Rendered) -> Iterator[tuple[str, dict[str, Any]]]:
    cluster = _cluster(r)
    head = ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    for i, c in enumerate(_containers(head)):
        yield f"{_rs_name(r)} spec.rayClusterConfig.headGroupSpec.template.spec.containers[{i}]", c
    for index, group in _groups(r).values():
        for i, c in enumerate(_containers((group.get("template") or {}).get("spec") or {})):
            yield _group_path(r, index) + f".template.spec.containers[{i}]", c


@rule
def ray_version(r: Rendered) -> Iterator[Finding]:
    declared = str(_cluster(r).get("rayVersion") or "")
    for _, c in _all_containers(r):
        tag = str(c.get("image") or "").split("@")[0].rpartition("/")[2].partition(":")[2]
        match = _VERSION.search(tag)
        if match and declared and match.group(1) != declared:
            yield Finding("ray-version",
                          f"rayVersion {declared} differs from the image's Ray {match.group(1)} ({c.get('image')})",
                          r.kustomization_file(), f"{_rs_name(r)} spec.rayClusterConfig.rayVersion",
                          "use an image built for the declared Ray version, or change rayVersion to match")


@rule
def image_pinned(r: Rendered) -> Iterator[Finding]:
    for path, c in _all_containers(r):
        image = str(c.get("image") or "")
        if "@sha256:" in image:
            continue
        tag = image.rpartition("/")[2].partition(":")[2]
        if not tag or tag in {"latest", "nightly", "main", "master"}:
            yield Finding("image-pinned", f"image {image!r} is not pinned (tag {tag or 'missing'!r})",
                          r.kustomization_file(), path + ".image",
                          "pin an exact tag or a digest with `images:` in the overlay's kustomization")


@rule
def resources(r: Rendered) -> Iterator[Finding]:
    for path, c in _all_containers(r):
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = [k for k in ("cpu", "memory") if k not in (res.get(kind) or {})]
            if missing:
                yield Finding("resources", f"container {c.get('name')!r} has no {kind} for {', '.join(missing)}",
                              r.kustomization_file(), f"{path}.resources.{kind}",
                              "set cpu and memory requests and limits: Ray sizes itself from them")


@rule
def replicas_ignored(r: Rendered) -> Iterator[Finding]:
    autoscaling = bool(_cluster(r).get("enableInTreeAutoscaling"))
    for name, (index, group) in _groups(r).items():
        lo, hi = int(group.get("minReplicas") or 0), int(group.get("maxReplicas") or 0)
        replicas = group.get("replicas")
        if replicas is None:
            continue
        replicas = int(replicas)
        if not lo <= replicas <= hi or (not autoscaling and not lo == replicas == hi):
            yield Finding("replicas-ignored", f"worker group {name!r} sets replicas {replicas} with min/max {lo}/{hi}: "
                          "RayService does not pass replicas edits to its RayCluster, so this never takes effect",
                          r.kustomization_file(), _group_path(r, index) + ".replicas",
                          "set replicas, minReplicas and maxReplicas together (autoscaling off) or enable autoscaling")


def lint(r: Rendered) -> list[Finding]:
    # Rule families kept in modules of their own (zone placement, instance facts, model sizing)
    # register into RULES when imported; imported here, once this module is whole, to avoid a cycle.
    from workflows.checks import instances, kv_compat, multinode, sizing, zone  # noqa: F401
    if r.rayservice is None:
        return [Finding("rayservice", "no RayService in the manifest", r.file, "",
                        "render an overlay: pdops render OVERLAY")]
    if not _args(r):
        return [Finding("serve-config", "spec.serveConfigV2 has no build_pd_openai_app application", r.file,
                        f"{_rs_name(r)} spec.serveConfigV2",
                        "render the overlay with pdops so the serve config is filled")]
    findings: list[Finding] = []
    for check in RULES:
        try:
            findings += check(r)
        except (TypeError, ValueError, AttributeError) as exc:   # a value of the wrong type or shape
            findings.append(Finding(check.__name__.replace("_", "-"), f"could not be checked: {exc}",
                                    r.kustomization_file(), "",
                                    "correct the value's type (the schema findings name the field)"))
    return findings
