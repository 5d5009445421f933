"""Phases that span nodes: pipeline parallelism across worker pods.

A replica takes TP x PP GPUs (vLLM ParallelConfig world_size = pipeline_parallel_size x
tensor_parallel_size, vllm/config/parallel.py __post_init__). Ray Serve LLM asks for one placement
bundle per worker, TP x PP of them (ray/llm/_internal/serve/engines/vllm/vllm_models.py
VLLMEngineConfig.placement_bundles), and vLLM's Ray executor ranks the workers node by node and groups
them [pp_rank][tp_rank] (vllm/v1/executor/ray_executor.py _init_workers_ray). So a phase spans nodes
cleanly when TP divides a pod's GPUs (rules tp-divides, gpu-fit) and a replica fills whole pods (pp-gpus);
the worker group then needs replicas x nodes-per-replica pods (gpu-fit), one zone (zone), a placement
strategy that can cross nodes (pp-placement), and EFA with NCCL pinned to its libfabric plugin (pp-efa,
pp-nccl). vLLM's NIXL connector refuses PP on the decode side (pp-decode) and serves PP producers
in push mode only (pp-kv-push), which Ray Serve LLM sets no side channel for (pp-side-channel).
"""
from __future__ import annotations

from collections.abc import Iterator

from workflows.checks.findings import Finding
from workflows.checks.instances import phase_instances
from workflows.render.rendered import EFA, Phase, RenderedRelease, WorkerGroup, serve_path
from workflows.render.serve_config import PHASES

# Strategies that can place one replica's bundles on several nodes with TP groups kept whole:
# STRICT_PACK needs every bundle on one node (never placeable past one node's GPUs); SPREAD and
# STRICT_SPREAD put bundles on different nodes, splitting TP groups across nodes.
SPANNING_STRATEGIES = {"PACK"}
# aws-ofi-nccl's plugin names: NCCL_NET="AWS Libfabric" (plugins <= 1.11 and still accepted) or "OFI"
# (aws/aws-ofi-nccl src/nccl_ofi_interface_nvidia.cpp nvidia_plugin_name_fixup). With NCCL_NET set,
# NCCL uses that network or fails; unset, it picks the best module it can load and falls back to its
# socket transport when the plugin does not load (NVIDIA NCCL user guide, Environment Variables, NCCL_NET).
NCCL_OFI_NAMES = {"aws libfabric", "ofi", "libfabric"}


def _spanning(v: RenderedRelease) -> Iterator[tuple[Phase, WorkerGroup, int]]:
    """(phase, its group, nodes per replica) for GPU phases whose replica spans pods."""
    if v.is_cpu:
        return
    for phase in v.phases.values():
        if phase.group is not None and (nodes := phase.nodes_per_replica) > 1:
            yield phase, phase.group, nodes


def pp_gpus(v: RenderedRelease) -> Iterator[Finding]:
    if v.is_cpu:
        return
    for name in PHASES:
        if name not in v.groups:
            continue
        gpus = int(v.groups[name].gpus)
        phase = v.phases[name]
        tp, pp, devices = phase.tp, phase.pp, phase.devices
        if gpus > 0 and tp <= gpus and devices > gpus and devices % gpus:
            whole = -(-devices // gpus)
            yield Finding("pp-gpus", f"{name} replicas take TP {tp} x PP {pp} = {devices} GPUs, not a whole number "
                          f"of {gpus}-GPU pods: a replica would take {whole - 1} pods and part of another, so stages "
                          "share a node with another replica's and PACK may split a stage's TP group across nodes",
                          v.serve_file, serve_path(name, "engine_kwargs.pipeline_parallel_size"),
                          f"make TP x PP a multiple of {gpus}"
                          + (f" (at TP {tp}: PP {whole * gpus // tp})" if gpus % tp == 0 else "")
                          + " or change the pod's GPU count")


def pp_placement(v: RenderedRelease) -> Iterator[Finding]:
    for phase, _, nodes in _spanning(v):
        name = phase.name
        strategy = (phase.config.get("placement_group_config") or {}).get("strategy", "PACK")
        if strategy not in SPANNING_STRATEGIES:
            why = ("needs all bundles on one node, which has fewer GPUs: the placement group is never created and "
                   "the replica stays pending" if strategy == "STRICT_PACK"
                   else "scatters bundles over nodes, splitting tensor-parallel groups across the network")
            yield Finding("pp-placement", f"{name} replicas span {nodes} nodes but the placement strategy "
                          f"{strategy} {why}", v.serve_file, serve_path(name, "placement_group_config.strategy"),
                          "do not override placement_group_config: pdops renders PACK for pipeline-parallel phases")


def pp_efa(v: RenderedRelease) -> Iterator[Finding]:
    pinned = phase_instances(v)
    for phase, group, nodes in _spanning(v):
        name, path = phase.name, group.path
        it_name, it = pinned[name][1:] if name in pinned else ("", None)
        if it is not None and it.efa == 0:
            yield Finding("pp-efa", f"{name} replicas span {nodes} {it_name} nodes but {it_name} has no EFA: every "
                          "forward pass sends activations between pipeline stages over TCP", v.kustomization_file,
                          path + ".template.spec.nodeSelector",
                          "pin an EFA-capable instance type (workflows/data/instance_types.yaml, efa > 0)")
        elif not group.limit(EFA):
            yield Finding("pp-efa", f"{name} replicas span {nodes} nodes but the pods request no {EFA}: pipeline "
                          "stages exchange activations every forward pass over the pod network (TCP) instead of EFA",
                          v.kustomization_file, path + f".template.spec.containers[0].resources.limits.{EFA}",
                          "add the efa component (kustomize/components/efa) and patch its count for the instance")
        elif str(group.env.get("NCCL_NET") or "").lower() not in NCCL_OFI_NAMES:
            yield Finding("pp-nccl", f"{name} replicas span {nodes} nodes over EFA but NCCL_NET is "
                          f"{group.env.get('NCCL_NET') or 'unset'}: when the aws-ofi-nccl plugin does not load, "
                          "NCCL falls back to its socket transport without an error and stages talk over TCP",
                          v.kustomization_file, path + ".template.spec.containers[0].env",
                          'set env NCCL_NET="AWS Libfabric" on the worker group (see overlays/prod-multinode)',
                          severity="warning")


# vLLM 0.32 NIXL (vllm/distributed/kv_transfer/kv_connector/v1/nixl/): NixlConnector is an alias of
# NixlPullConnector (connector.py). A PP > 1 worker is written for push mode ("PP>1 (push mode): this
# worker holds a contiguous layer slice and transfers into the matching sub-range of a PP=1 remote's
# regions", base_worker.py NixlBaseConnectorWorker.__init__), while a pulling decode reads from the
# producer's PP rank 0 agents only (pull_worker.py `self._remote_agents[dst_engine_id][(0, remote_rank)]`).
PULL_CONNECTORS = {"NixlConnector", "NixlPullConnector"}
PUSH_CONNECTOR = "NixlPushConnector"
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"


def pp_decode(v: RenderedRelease) -> Iterator[Finding]:
    connector, pp = v.phases["decode"].connector, v.phases["decode"].pp
    if pp > 1 and connector.startswith("Nixl"):
        yield Finding("pp-decode", f"decode has pipeline_parallel_size {pp} with {connector}: vLLM's "
                      "NIXL worker raises NotImplementedError for a kv_consumer with PP > 1 "
                      "(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py, \"Decode-side PP is "
                      "unsupported\"), so decode never starts", v.serve_file,
                      serve_path("decode", "engine_kwargs.pipeline_parallel_size"),
                      "keep decode at pipeline_parallel_size 1 on nodes that hold the model (larger GPUs or a "
                      "quantized model); prefill may span nodes")


def pp_kv_transfer(v: RenderedRelease) -> Iterator[Finding]:
    connector, pp = v.phases["prefill"].connector, v.phases["prefill"].pp
    if pp > 1 and connector in PULL_CONNECTORS:
        yield Finding("pp-kv-push", f"prefill has pipeline_parallel_size {pp} with {connector} (pull "
                      "mode): vLLM writes PP > 1 producers for push mode only, and a pulling decode reads the KV of "
                      "the first pipeline stage's workers alone (vllm .../nixl/pull_worker.py reads agents "
                      "(0, remote_rank); base_worker.py \"PP>1 (push mode)\")", v.serve_file,
                      serve_path("prefill", "engine_kwargs.kv_transfer_config.kv_connector"),
                      f"set kv_transfer.connector: {PUSH_CONNECTOR} in release.yaml")
    if PUSH_CONNECTOR not in {connector, v.phases["decode"].connector}:
        return
    # Ray Serve LLM 2.60 registers backends for NixlConnector, LMCacheConnectorV1, MultiConnector and
    # MoRIIOConnector only (ray/llm/_internal/serve/engines/vllm/kv_transfer/factory.py BUILTIN_BACKENDS);
    # any other connector gets DefaultConnectorBackend, whose setup() is a no-op, so the NIXL side
    # channel host is not set to the node's IP (kv_transfer/nixl.py _set_side_channel_host) and vLLM
    # advertises its default, localhost (vllm/envs.py VLLM_NIXL_SIDE_CHANNEL_HOST; read by the engine's
    # scheduler, nixl/base_scheduler.py): the other phase's engines then handshake with themselves.
    for name, group in v.groups.items():
        if name in PHASES and SIDE_CHANNEL_HOST not in group.env_names:
            yield Finding("pp-side-channel", f"{name} uses {PUSH_CONNECTOR}, which Ray Serve LLM sets no NIXL side "
                          f"channel for, and its pods do not set {SIDE_CHANNEL_HOST}: vLLM advertises localhost and "
                          "cross-node handshakes fail", v.kustomization_file,
                          group.path + ".template.spec.containers[0].env",
                          f"set env {SIDE_CHANNEL_HOST} from the pod IP (valueFrom.fieldRef status.podIP) on the "
                          f"{name} group, as overlays/prod-multinode does")


RULES = [pp_gpus, pp_placement, pp_efa, pp_decode, pp_kv_transfer]
