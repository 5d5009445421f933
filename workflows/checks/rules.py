"""Cross-layer lint: rules that need the serve config, the RayService and the node groups at once.

Each rule reads the rendered release only (so `check -f manifest.yaml` runs them too) and names
the file a person edits: release.yaml for serve-config fields, the kustomization for the rest.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from workflows.checks import deadlines, instances, kv_compat, multinode, sizing, zone
from workflows.checks.findings import Finding
from workflows.render.manifest import Rendered
from workflows.render.rendered import EFA, GPU, RenderedRelease, serve_path
from workflows.render.serve_config import KV_ROLE, PHASE_RESOURCE, PHASES

EFA_TAINTS = ("vpc.amazonaws.com/efa", "aws.amazon.com/efa")
Rule = Callable[[RenderedRelease], Iterator[Finding]]


# ---- serve-config rules ----------------------------------------------------------------------

def model_mismatch(v: RenderedRelease) -> Iterator[Finding]:
    ids = {n: (v.phases[n].config.get("model_loading_config") or {}).get("model_id") for n in PHASES}
    if ids["prefill"] != ids["decode"]:
        yield Finding("model-mismatch", f"prefill serves {ids['prefill']!r} but decode serves {ids['decode']!r}",
                      v.serve_file, serve_path("decode", "model_loading_config.model_id"),
                      "both phases must serve the same model: remove per-phase model overrides in release.yaml")


def kv_role(v: RenderedRelease) -> Iterator[Finding]:
    for name in PHASES:
        kv = v.phases[name].kv
        if not isinstance(kv, dict):
            continue  # kv-connector reports the missing config
        role, want = kv.get("kv_role"), KV_ROLE[name]
        field = serve_path(name, "engine_kwargs.kv_transfer_config.kv_role")
        if role is None:
            yield Finding("kv-role", f"{name} has no kv_role", v.serve_file, field, f"set kv_role: {want}")
        elif role == "kv_both":
            yield Finding("kv-role", f"{name} uses the deprecated kv_role kv_both", v.serve_file, field,
                          f"use kv_role: {want} ({name} {'produces' if name == 'prefill' else 'consumes'} KV)")
        elif role != want:
            yield Finding("kv-role", f"{name} has kv_role {role!r}; prefill/decode roles are swapped or wrong",
                          v.serve_file, field, f"set kv_role: {want}")


# vLLM connectors that run in P/D configs without error but do not hand prefill's KV to decode.
NOT_PD_CONNECTORS = {
    "DecodeBenchConnector": "decode fills its KV cache with dummy values (a benchmark tool)",
    "ExampleConnector": "an example that saves and loads KV through local files on one node",
    "OffloadingConnector": "it offloads one engine's KV to CPU memory",
    "SimpleCPUOffloadConnector": "it offloads one engine's KV to CPU memory",
}


def kv_connector(v: RenderedRelease) -> Iterator[Finding]:
    kvs = {n: v.phases[n].kv for n in PHASES}
    for name, kv in kvs.items():
        if not isinstance(kv, dict) or not kv.get("kv_connector"):
            yield Finding("kv-connector", f"{name} has no kv_transfer_config.kv_connector: KV cannot move",
                          v.serve_file, serve_path(name, "engine_kwargs.kv_transfer_config"),
                          "set kv_transfer.connector in release.yaml (NixlConnector)")
    p, d = kvs["prefill"], kvs["decode"]   # PHASES
    if isinstance(p, dict) and isinstance(d, dict) and p.get("kv_connector") and d.get("kv_connector"):
        why = NOT_PD_CONNECTORS.get(p["kv_connector"])
        if why:
            yield Finding("kv-connector", f"{p['kv_connector']} does not move KV from prefill to decode: {why}; "
                          "the golden-token check will fail such a candidate", v.serve_file,
                          serve_path("prefill", "engine_kwargs.kv_transfer_config.kv_connector"),
                          "set kv_transfer.connector in release.yaml to a P/D transport (NixlConnector)",
                          severity="warning")
        if p["kv_connector"] != d["kv_connector"]:
            yield Finding("kv-connector", f"prefill uses {p['kv_connector']} but decode uses {d['kv_connector']}",
                          v.serve_file, serve_path("decode", "engine_kwargs.kv_transfer_config.kv_connector"),
                          "use one connector for both phases (kv_transfer.connector)")
        pb = (p.get("kv_connector_extra_config") or {}).get("backends")
        db = (d.get("kv_connector_extra_config") or {}).get("backends")
        if pb != db:
            yield Finding("kv-connector", f"NIXL backends differ: prefill {pb}, decode {db}", v.serve_file,
                          serve_path("decode", "engine_kwargs.kv_transfer_config.kv_connector_extra_config.backends"),
                          "use the same kv_transfer.backends for both phases")


def tp_order(v: RenderedRelease) -> Iterator[Finding]:
    if v.phases["prefill"].tp > v.phases["decode"].tp:
        yield Finding("tp-order",
                      f"prefill tensor_parallel_size {v.phases['prefill'].tp} exceeds decode's {v.phases['decode'].tp}",
                      v.serve_file, serve_path("prefill", "engine_kwargs.tensor_parallel_size"),
                      "vLLM's heterogeneous-TP KV transfer needs prefill TP <= decode TP: "
                      "lower prefill or raise decode")


def max_model_len(v: RenderedRelease) -> Iterator[Finding]:
    known = v.max_positions
    if not known:
        return
    for name in PHASES:
        mml = v.phases[name].engine.get("max_model_len")
        if mml is not None and int(mml) > int(known):
            yield Finding("max-model-len", f"{name} max_model_len {mml} exceeds the model's limit {known}",
                          v.serve_file, serve_path(name, "engine_kwargs.max_model_len"),
                          f"set model.max_model_len <= {known}")


# ---- RayService / node-group rules -----------------------------------------------------------

def placement(v: RenderedRelease) -> Iterator[Finding]:
    groups = v.groups
    for name in PHASES:
        res = PHASE_RESOURCE[name]
        if name not in groups:
            yield Finding("placement", f"no worker group named {name!r}", v.kustomization_file,
                          f"{v.name} spec.rayClusterConfig.workerGroupSpecs",
                          "keep the base's prefill and decode groups; patch them by groupName")
            continue
        group = groups[name]
        advertised = group.ray_resources or {}
        if not advertised.get(res):
            yield Finding("placement", f"worker group {name!r} does not advertise the Ray resource {res!r}, so "
                          f"{name} replicas may land on any node", v.kustomization_file,
                          group.path + ".rayStartParams.resources",
                          f"set rayStartParams.resources to '\"{{\\\"{res}\\\": 1}}\"' (as in kustomize/base)")
        bundle = (v.phases[name].config.get("placement_group_config") or {}).get("bundle_per_worker") or {}
        bundles = (v.phases[name].config.get("placement_group_config") or {}).get("bundles") or [bundle]
        if not all(b.get(res) for b in bundles):
            yield Finding("placement", f"{name} placement bundles do not request {res!r}: the phase is not pinned "
                          "to its worker group", v.serve_file, serve_path(name, "placement_group_config"),
                          "do not override placement_group_config in release.yaml")


def gpu_fit(v: RenderedRelease) -> Iterator[Finding]:
    if any((v.phases[n].config.get("accelerator_config") or {}).get("kind") == "cpu" for n in PHASES):
        return
    groups = v.groups
    for name in PHASES:
        if name not in groups:
            continue
        group = groups[name]
        gpus = group.gpus
        phase = v.phases[name]
        tp, pp, replicas, pods = phase.tp, phase.pp, phase.max_serve_replicas, group.max_pods
        field = group.path + f".template.spec.containers[0].resources.limits.{GPU}"
        if gpus <= 0:
            yield Finding("gpu-fit", f"worker group {name!r} requests no GPUs but serves a GPU engine",
                          v.kustomization_file, field, f"set limits {GPU} on the {name} group's container")
        elif tp > gpus:   # TP all-reduces every layer: it stays within a node; PP is what crosses nodes
            yield Finding("gpu-fit", f"{name} tensor_parallel_size {tp} does not fit one {name} pod ({gpus:g} GPUs)",
                          v.kustomization_file, field, "lower tensor_parallel_size or use a larger instance type "
                          "(a model that needs more GPUs spans nodes with pipeline_parallel_size)")
        elif (nodes := phase.nodes_per_replica) > 1:
            if replicas * nodes > pods:   # a spanning replica takes whole pods (rule pp-gpus)
                yield Finding("gpu-fit", f"{name} needs {replicas} replicas x {nodes} nodes per replica (TP {tp} x PP "
                              f"{pp} = {phase.devices} GPUs over {gpus:g}-GPU pods) = {replicas * nodes} "
                              f"pods but the group offers at most {pods}", v.kustomization_file,
                              group.path + ".maxReplicas",
                              f"set the {name} group's replicas, minReplicas and maxReplicas to {replicas * nodes}")
        elif replicas * phase.devices > pods * gpus:
            per = f"TP {tp}" if pp == 1 else f"TP {tp} x PP {pp}"
            need = replicas * phase.devices
            yield Finding("gpu-fit", f"{name} needs {replicas} replicas x {per} = {need} GPUs but the group "
                          f"offers at most {pods} pods x {gpus:g} GPUs = {pods * gpus:g}", v.kustomization_file,
                          group.path + ".maxReplicas",
                          f"raise maxReplicas to {-(-need // int(gpus))} or lower {name} replicas")


def efa(v: RenderedRelease) -> Iterator[Finding]:
    for name, group in v.groups.items():
        if name not in PHASES:
            continue
        efa_limit = group.limit(EFA) > 0
        on_efa = efa_limit or group.env.get("FI_PROVIDER") == "efa"
        backends = ((v.phases[name].kv or {}).get("kv_connector_extra_config") or {}).get("backends") or ["UCX"]
        if on_efa and "LIBFABRIC" not in backends:
            yield Finding("efa-backend", f"{name} runs on EFA nodes but NIXL backends are {backends}: NIXL silently "
                          "falls back to TCP (TTFT ~100x worse, no error)", v.serve_file,
                          serve_path(name, "engine_kwargs.kv_transfer_config.kv_connector_extra_config.backends"),
                          "set kv_transfer.backends: [LIBFABRIC] in release.yaml")
        if "LIBFABRIC" in backends or on_efa:
            tolerated = {t.get("key") for t in group.pod.get("tolerations") or []}
            if not efa_limit:
                yield Finding("efa-resource", f"{name} uses EFA (LIBFABRIC/FI_PROVIDER) but requests no {EFA}",
                              v.kustomization_file,
                              group.path + f".template.spec.containers[0].resources.limits.{EFA}",
                              "add the efa component (kustomize/components/efa) to the overlay")
            elif not tolerated.intersection(EFA_TAINTS):
                yield Finding("efa-resource", f"{name} requests EFA but does not tolerate the EFA node taint",
                              v.kustomization_file, group.path + ".template.spec.tolerations",
                              "add the efa component (kustomize/components/efa) to the overlay")


_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


def ray_version(v: RenderedRelease) -> Iterator[Finding]:
    declared = str(v.cluster.get("rayVersion") or "")
    for _, c in v.containers():
        tag = str(c.get("image") or "").split("@")[0].rpartition("/")[2].partition(":")[2]
        match = _VERSION.search(tag)
        if match and declared and match.group(1) != declared:
            yield Finding("ray-version",
                          f"rayVersion {declared} differs from the image's Ray {match.group(1)} ({c.get('image')})",
                          v.kustomization_file, f"{v.name} spec.rayClusterConfig.rayVersion",
                          "use an image built for the declared Ray version, or change rayVersion to match")


def image_pinned(v: RenderedRelease) -> Iterator[Finding]:
    for path, c in v.containers():
        image = str(c.get("image") or "")
        if "@sha256:" in image:
            continue
        tag = image.rpartition("/")[2].partition(":")[2]
        if not tag or tag in {"latest", "nightly", "main", "master"}:
            yield Finding("image-pinned", f"image {image!r} is not pinned (tag {tag or 'missing'!r})",
                          v.kustomization_file, path + ".image",
                          "pin an exact tag or a digest with `images:` in the overlay's kustomization")


def resources(v: RenderedRelease) -> Iterator[Finding]:
    for path, c in v.containers():
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = [k for k in ("cpu", "memory") if k not in (res.get(kind) or {})]
            if missing:
                yield Finding("resources", f"container {c.get('name')!r} has no {kind} for {', '.join(missing)}",
                              v.kustomization_file, f"{path}.resources.{kind}",
                              "set cpu and memory requests and limits: Ray sizes itself from them")


def replicas_ignored(v: RenderedRelease) -> Iterator[Finding]:
    autoscaling = bool(v.cluster.get("enableInTreeAutoscaling"))
    for name, group in v.groups.items():
        lo, hi = int(group.raw.get("minReplicas") or 0), int(group.raw.get("maxReplicas") or 0)
        replicas = group.raw.get("replicas")
        if replicas is None:
            continue
        replicas = int(replicas)
        if not lo <= replicas <= hi or (not autoscaling and not lo == replicas == hi):
            yield Finding("replicas-ignored", f"worker group {name!r} sets replicas {replicas} with min/max {lo}/{hi}: "
                          "RayService does not pass replicas edits to its RayCluster, so this never takes effect",
                          v.kustomization_file, group.path + ".replicas",
                          "set replicas, minReplicas and maxReplicas together (autoscaling off) or enable autoscaling")


# Every rule, in the order findings are reported: this module's, then the families kept in modules
# of their own (instance facts, KV compatibility, nodes spanned by pipeline stages, model sizing,
# zone placement). Those modules import the typed view (workflows/render/rendered.py), never this one.
RULES: list[Rule] = [
    model_mismatch, kv_role, kv_connector, tp_order, max_model_len,
    placement, gpu_fit, efa, ray_version, image_pinned, resources, replicas_ignored,
    *instances.RULES, *kv_compat.RULES, *multinode.RULES, *sizing.RULES, *zone.RULES, *deadlines.RULES,
]


def lint(r: Rendered) -> list[Finding]:
    """Every rule's findings on one typed view of the rendered release (built once, here)."""
    if r.rayservice is None:
        return [Finding("rayservice", "no RayService in the manifest", r.file, "",
                        "render an overlay: pdops render OVERLAY")]
    v = RenderedRelease.of(r)
    if not v.args:
        return [Finding("serve-config", "spec.serveConfigV2 has no build_pd_openai_app application", r.file,
                        f"{v.name} spec.serveConfigV2",
                        "render the overlay with pdops so the serve config is filled")]
    findings: list[Finding] = []
    for check in RULES:
        try:
            findings += check(v)
        except (TypeError, ValueError, AttributeError) as exc:   # a value of the wrong type or shape
            findings.append(Finding(check.__name__.replace("_", "-"), f"could not be checked: {exc}",
                                    v.kustomization_file, "",
                                    "correct the value's type (the schema findings name the field)"))
    return findings
