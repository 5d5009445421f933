"""A phase that spans nodes (pipeline parallelism across worker pods): the spec field, the serve
config Ray Serve LLM builds its placement group from, the pp-* rules and capacity accounting (each
firing on a broken render of overlays/prod-multinode and silent on the overlay), sizing over TP x PP,
and the overlay's place outside the Argo environments."""
from __future__ import annotations

import copy

import pytest
import yaml

from tests.conftest import ROOT
from workflows.argo import definitions as argo
from workflows.checks.rules import lint
from workflows.checks.sizing import size_table
from workflows.errors import InputError
from workflows.render.serve_config import build_serve_config
from workflows.render.sizing import kv_bytes_per_token, stage_layers
from workflows.spec.release import parse_spec

ENV = "prod-multinode"
P405 = 405.85e9 * 2          # bytes of bf16 weights
GIB = 2**30


def _findings(r, rule):
    return [f for f in lint(r) if f.rule == rule]


def _group(r, name):
    return next(g for g in r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name)


def _container(r, name):
    return _group(r, name)["template"]["spec"]["containers"][0]


def _edit_phase(r, name, fn):
    rs = r.rayservice
    config = yaml.safe_load(rs["spec"]["serveConfigV2"])
    fn(config["applications"][0]["args"][f"{name}_config"])
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)


def _engine(r, name, **kwargs):
    _edit_phase(r, name, lambda c: c["engine_kwargs"].update(kwargs))


def _spec(**phases):
    return parse_spec({"name": "pd", "model": {"id": "m", "source": "/m"}, **phases}, "release.yaml")


# ---- spec and serve config -------------------------------------------------------------------

def test_pipeline_parallel_size_renders_into_engine_kwargs_with_a_placement_that_can_span_nodes():
    args = build_serve_config(_spec(prefill={"tensor_parallel_size": 8, "pipeline_parallel_size": 2}))
    pre, dec = (args["applications"][0]["args"][f"{n}_config"] for n in ("prefill", "decode"))
    assert pre["engine_kwargs"]["pipeline_parallel_size"] == 2 and pre["engine_kwargs"]["tensor_parallel_size"] == 8
    assert pre["placement_group_config"]["strategy"] == "PACK"
    # Without stages nothing changes: no key (vLLM's default 1) and a replica kept on one node.
    assert "pipeline_parallel_size" not in dec["engine_kwargs"] and dec["placement_group_config"]["strategy"] == "STRICT_PACK"


def test_pipeline_parallel_size_in_engine_kwargs_is_refused_with_the_spec_field_named():
    with pytest.raises(InputError) as exc:
        _spec(prefill={"engine_kwargs": {"pipeline_parallel_size": 2}})
    assert exc.value.field == "prefill.engine_kwargs" and "pipeline_parallel_size of this phase" in str(exc.value)
    with pytest.raises(InputError) as exc:
        _spec(decode={"pipeline_parallel_size": 0})
    assert exc.value.field == "decode.pipeline_parallel_size"


def test_ray_serve_llm_builds_tp_x_pp_bundles_on_the_phase_resource_from_the_rendered_config(rendered_overlays):
    """Ray's own engine config (ray/llm/_internal/serve/engines/vllm/vllm_models.py) from the committed
    overlay's LLMConfig: the placement group a prefill replica asks for, and the Ray executor."""
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    config = yaml.safe_load(rendered_overlays[ENV].rayservice["spec"]["serveConfigV2"])["applications"][0]["args"]
    pre = LLMConfig.model_validate(copy.deepcopy(config["prefill_config"])).get_engine_config()
    assert pre.num_devices == 16 and pre.placement_strategy == "PACK"
    assert len(pre.placement_bundles) == 16 and all(b["GPU"] == 1 and b["prefill_node"] == 1 for b in pre.placement_bundles)
    assert pre.get_initialization_kwargs()["distributed_executor_backend"] == "ray"
    assert pre.get_initialization_kwargs()["pipeline_parallel_size"] == 2
    dec = LLMConfig.model_validate(copy.deepcopy(config["decode_config"])).get_engine_config()
    assert dec.num_devices == 8 and dec.placement_strategy == "STRICT_PACK"


def test_vllm_cpu_build_cannot_run_stages_on_two_ray_nodes():
    """Why the local stack does not run this overlay: Ray Serve LLM gives CPU engines the mp executor
    (vllm_models.py get_initialization_kwargs), and vLLM's CPU platform has no Ray device key, so its
    Ray executor refuses to start ("current platform cpu does not support ray", v1/executor/ray_utils.py)."""
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from vllm.platforms.cpu import CpuPlatform

    spec = _spec(accelerator={"kind": "cpu"}, prefill={"pipeline_parallel_size": 2})
    cfg = build_serve_config(spec)["applications"][0]["args"]["prefill_config"]
    kwargs = LLMConfig.model_validate(cfg).get_engine_config().get_initialization_kwargs()
    assert kwargs["distributed_executor_backend"] == "mp" and CpuPlatform.ray_device_key == ""


# ---- the committed example -------------------------------------------------------------------

def test_example_overlay_is_clean_and_spans_two_nodes_per_prefill_replica(rendered):
    r = rendered(ENV)
    assert [f for f in lint(r) if f.severity != "info"] == []
    pre, dec = size_table(r)["phases"]
    assert (pre["tp"], pre["pp"], pre["nodes_per_replica"]) == (8, 2, 2) and dec["nodes_per_replica"] == 1
    assert _group(r, "prefill")["replicas"] == 2 == pre["replicas"] * pre["nodes_per_replica"]


def test_sizing_splits_weights_and_kv_over_tp_and_pp(rendered):
    pre, dec = size_table(rendered(ENV))["phases"]
    assert pre["weights_per_device_gib"] == pytest.approx(P405 / 8 / 2 / GIB)        # 126 layers: 63 per stage
    assert pre["kv_bytes_per_token_per_device"] == 2 * 63 * 1 * 128 * 2              # 63 layers, 8 KV heads / TP 8
    room = 80 * 0.92 - P405 / 16 / GIB
    assert pre["kv_room_gib"] == pytest.approx(room) and pre["kv_tokens_per_replica"] == int(room * GIB // 32256)
    assert dec["weights_per_device_gib"] == pytest.approx(P405 / 8 / GIB)


def test_largest_stage_sets_the_per_gpu_share_when_layers_do_not_divide():
    from workflows.spec.release import Architecture

    arch = Architecture(parameters=81e9, layers=81, kv_heads=8, head_dim=128)
    assert stage_layers(arch, 2) == 41 and stage_layers(arch, 1) == 81     # vllm get_pp_indices: 41 + 40
    assert kv_bytes_per_token(arch, None, 8, 2) == 2 * 41 * 1 * 128 * 2


def test_one_phase_at_pp_1_cannot_hold_a_405b_model_and_the_fix_names_pipeline_parallelism(rendered):
    r = rendered(ENV)
    _engine(r, "prefill", pipeline_parallel_size=1)    # 94.5 GiB per H100 at TP 8
    [f] = _findings(r, "size-weights")
    assert "94.5 GiB per GPU at TP 8 > 73.6 GiB" in f.message and "pipeline_parallel_size" in f.fix
    assert _findings(rendered(ENV), "size-weights") == []


def test_one_node_note_says_which_phase_spans_nodes(rendered):
    note = size_table(rendered(ENV))["one_node"]
    assert note.startswith("the model fits on one p5e.48xlarge; prefill spans 2 p5.48xlarge per replica")


# ---- rules, each firing and silent -----------------------------------------------------------

def test_pp_gpus_replica_must_fill_whole_pods(rendered):
    r = rendered(ENV)
    _engine(r, "prefill", tensor_parallel_size=4, pipeline_parallel_size=3)   # 12 GPUs over 8-GPU pods
    [f] = _findings(r, "pp-gpus")
    assert "TP 4 x PP 3 = 12 GPUs, not a whole number of 8-GPU pods" in f.message and "PP 4" in f.fix
    assert f.file.endswith("overlays/prod-multinode/release.yaml")
    r = rendered(ENV)
    _engine(r, "prefill", tensor_parallel_size=4, pipeline_parallel_size=4)   # 16 GPUs: two whole pods
    assert _findings(r, "pp-gpus") == [] and _findings(rendered(ENV), "pp-gpus") == []


def test_tp_larger_than_a_pod_is_still_refused_and_points_at_pipeline_parallelism(rendered):
    r = rendered(ENV)
    _engine(r, "prefill", tensor_parallel_size=16, pipeline_parallel_size=1)
    [f] = _findings(r, "gpu-fit")
    assert "tensor_parallel_size 16 does not fit one prefill pod (8 GPUs)" in f.message
    assert "pipeline_parallel_size" in f.fix


def test_worker_group_must_hold_replicas_times_nodes_per_replica(rendered):
    r = rendered(ENV)
    for k in ("replicas", "minReplicas", "maxReplicas"):
        _group(r, "prefill")[k] = 1
    [f] = _findings(r, "gpu-fit")
    assert "1 replicas x 2 nodes per replica" in f.message and "= 2 pods but the group offers at most 1" in f.message
    assert f.fix.endswith("to 2") and f.field.endswith("workerGroupSpecs[0].maxReplicas")
    r = rendered(ENV)
    _edit_phase(r, "prefill", lambda c: c["deployment_config"].update(num_replicas=2))
    [f] = _findings(r, "gpu-fit")
    assert "= 4 pods" in f.message
    assert _findings(rendered(ENV), "gpu-fit") == []


@pytest.mark.parametrize("strategy", ["STRICT_PACK", "SPREAD", "STRICT_SPREAD"])
def test_pp_placement_strategy_must_cross_nodes_with_tp_groups_whole(rendered, strategy):
    r = rendered(ENV)
    _edit_phase(r, "prefill", lambda c: c["placement_group_config"].update(strategy=strategy))
    [f] = _findings(r, "pp-placement")
    assert f"span 2 nodes but the placement strategy {strategy}" in f.message
    assert _findings(rendered(ENV), "pp-placement") == []


def test_pp_efa_spanning_replicas_need_efa(rendered):
    r = rendered(ENV)
    c = _container(r, "prefill")["resources"]
    for kind in ("requests", "limits"):
        c[kind].pop("vpc.amazonaws.com/efa")
    [f] = _findings(r, "pp-efa")
    assert "span 2 nodes but the pods request no vpc.amazonaws.com/efa" in f.message
    r = rendered(ENV)
    _group(r, "prefill")["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] = "g5.xlarge"
    [f] = _findings(r, "pp-efa")          # (the pods' 8 GPUs on a 1-GPU type: instance-gpus says so too)
    assert "span 2 g5.xlarge nodes but g5.xlarge has no EFA" in f.message
    assert _findings(rendered(ENV), "pp-efa") == []


def test_pp_nccl_warns_when_nccl_may_fall_back_to_sockets(rendered):
    r = rendered(ENV)
    env = _container(r, "prefill")["env"]
    env[:] = [e for e in env if e["name"] != "NCCL_NET"]
    [f] = _findings(r, "pp-nccl")
    assert f.severity == "warning" and "NCCL_NET is unset" in f.message and "AWS Libfabric" in f.fix
    assert _findings(rendered(ENV), "pp-nccl") == []
    assert _findings(rendered("prod"), "pp-nccl") == []        # no phase spans nodes there


def test_pp_decode_nixl_refuses_decode_pipeline_stages(rendered):
    r = rendered(ENV)
    _engine(r, "decode", pipeline_parallel_size=2)
    [f] = _findings(r, "pp-decode")
    assert "NotImplementedError" in f.message and f.field.endswith("decode_config.engine_kwargs.pipeline_parallel_size")
    r = rendered(ENV)
    _engine(r, "decode", pipeline_parallel_size=2)
    _edit_phase(r, "decode", lambda c: c["engine_kwargs"]["kv_transfer_config"].update(kv_connector="LMCacheConnectorV1"))
    assert _findings(r, "pp-decode") == []
    assert _findings(rendered(ENV), "pp-decode") == []


def test_zone_finding_names_the_stages_of_a_spanning_phase(rendered):
    r = rendered(ENV)
    del _group(r, "prefill")["template"]["spec"]["nodeSelector"]["topology.kubernetes.io/zone"]
    [f] = _findings(r, "zone")
    assert "pipeline stages span 2 nodes, which would also cross zones" in f.message
    r = rendered("prod")
    del _group(r, "prefill")["template"]["spec"]["nodeSelector"]["topology.kubernetes.io/zone"]
    [f] = _findings(r, "zone")
    assert "pipeline" not in f.message
    assert _findings(rendered(ENV), "zone") == []


def test_pp_kv_push_a_pipeline_parallel_prefill_needs_the_push_connector(rendered):
    r = rendered(ENV)
    for phase in ("prefill", "decode"):
        _edit_phase(r, phase, lambda c: c["engine_kwargs"]["kv_transfer_config"].update(kv_connector="NixlConnector"))
    [f] = _findings(r, "pp-kv-push")
    assert "pull" in f.message and "NixlPushConnector" in f.fix
    assert _findings(r, "pp-side-channel") == []        # Ray sets the side channel for NixlConnector itself
    assert _findings(rendered(ENV), "pp-kv-push") == [] and _findings(rendered("prod"), "pp-kv-push") == []


def test_pp_side_channel_push_connector_needs_the_pod_ip_advertised(rendered):
    from ray.llm._internal.serve.engines.vllm.kv_transfer.base import DefaultConnectorBackend
    from ray.llm._internal.serve.engines.vllm.kv_transfer.factory import KVConnectorBackendFactory

    # the upstream fact the rule rests on: Ray Serve LLM has no backend of its own for the push connector
    assert KVConnectorBackendFactory.get_backend_class("NixlPushConnector") is DefaultConnectorBackend
    r = rendered(ENV)
    env = _container(r, "decode")["env"]
    env[:] = [e for e in env if e["name"] != "VLLM_NIXL_SIDE_CHANNEL_HOST"]
    [f] = _findings(r, "pp-side-channel")
    assert f.message.startswith("decode uses NixlPushConnector") and "status.podIP" in f.fix
    assert _findings(rendered(ENV), "pp-side-channel") == []


# ---- outside the Argo environments, deliberately ---------------------------------------------

def test_example_overlay_is_not_an_argo_environment_and_a_push_to_it_releases_nothing():
    from tests.unit.test_webhook import commit, delivery, environments

    assert ENV not in argo.ENVIRONMENTS
    sensor = next(d for d in yaml.safe_load_all((ROOT / "kustomize" / "argo" / "events.yaml").read_text())
                  if d and d["kind"] == "Sensor")
    assert environments(sensor, delivery(commits=[commit(modified=[f"overlays/{ENV}/release.yaml"])])) == set()
    assert environments(sensor, delivery(commits=[commit(modified=["overlays/prod/release.yaml"])])) == {"prod"}


def test_pre_commit_checks_the_example_when_its_files_change():
    from workflows.render.changed import affected_overlays

    assert [p.name for p in affected_overlays([f"overlays/{ENV}/node-groups.yaml"], cwd=ROOT)] == [ENV]
