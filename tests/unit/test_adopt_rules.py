"""Placement, instance-fact and sizing rules (workflows/checks/{zone,instances,sizing}.py): each fires on a
deliberately broken render of a committed overlay and stays silent on the overlays themselves."""
from __future__ import annotations

import json

import pytest
import yaml

from workflows.checks.rules import lint
from workflows.checks.sizing import size_table
from workflows.spec.instance_types import allowed_values, table

ZONE = "topology.kubernetes.io/zone"
TYPE = "node.kubernetes.io/instance-type"


def _findings(r, rule):
    return [f for f in lint(r) if f.rule == rule]


def _group(r, name):
    return next(g for g in r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name)


def _pod(r, name):
    return _group(r, name)["template"]["spec"]


def _res(r, name, **values):
    c = _pod(r, name)["containers"][0]["resources"]
    for kind in ("requests", "limits"):
        c[kind].update(values)


def _edit_engine(r, name, **kwargs):
    rs = r.rayservice
    config = yaml.safe_load(rs["spec"]["serveConfigV2"])
    config["applications"][0]["args"][f"{name}_config"]["engine_kwargs"].update(kwargs)
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)


@pytest.mark.parametrize("env", ["dev", "staging", "prod", "local"])
def test_overlays_pass_placement_instance_and_sizing(rendered, env):
    rules = {"zone", "instance-type", "instance-capacity", "instance-gpus", "instance-efa", "efa-capable",
             "tp-divides", "accelerator-type", "pd-same-node", "size-weights", "size-kv", "size-load"}
    assert [f for f in lint(rendered(env)) if f.rule in rules] == []


# ---- one availability zone ------------------------------------------------------------------

def test_zone_unpinned_phase_is_rejected(rendered):
    r = rendered("prod")
    del _pod(r, "decode")["nodeSelector"][ZONE]
    [f] = _findings(r, "zone")
    assert "decode pods can land in any availability zone" in f.message
    assert f.file.endswith("overlays/prod/kustomization.yaml") and "workerGroupSpecs[1]" in f.field


def test_zone_different_zones_are_rejected(rendered):
    r = rendered("staging")
    _pod(r, "decode")["nodeSelector"][ZONE] = "us-east-1b"
    [f] = _findings(r, "zone")
    assert "prefill is pinned to us-east-1a but decode to us-east-1b" in f.message


def test_zone_affinity_allowing_two_zones_is_rejected_and_one_zone_passes(rendered):
    r = rendered("dev")
    for name in ("prefill", "decode"):
        del _pod(r, name)["nodeSelector"][ZONE]
        _pod(r, name)["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "In",
                                                         "values": ["us-east-1a", "us-east-1b"]}]}]}}}
    assert {f.message.split(":")[0] for f in _findings(r, "zone")} == {
        "prefill pods can land in us-east-1a, us-east-1b", "decode pods can land in us-east-1a, us-east-1b"}
    for name in ("prefill", "decode"):
        _pod(r, name)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["us-east-1a"]
    assert _findings(r, "zone") == []


def test_node_affinity_terms_are_ored_and_expressions_anded():
    # k8s.io/api core/v1 NodeSelector: "The terms are ORed"; NodeSelectorTerm requirements are ANDed.
    term = lambda *vals: {"matchExpressions": [{"key": ZONE, "operator": "In", "values": list(v)} for v in vals]}
    aff = lambda *terms: {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}
    assert allowed_values(aff(term(["a", "b"], ["b", "c"])), ZONE) == {"b"}
    assert allowed_values(aff(term(["a"]), term(["c"])), ZONE) == {"a", "c"}
    assert allowed_values(aff(term(["a"]), {"matchExpressions": []}), ZONE) is None   # a free term frees it
    assert allowed_values({"nodeSelector": {ZONE: "a"}, **aff(term(["b"]))}, ZONE) == set()


def test_zone_skips_cpu_release(rendered):
    assert _findings(rendered("local"), "zone") == []


# ---- instance facts -------------------------------------------------------------------------

def test_more_gpus_than_the_instance_has(rendered):
    r = rendered("dev")
    _res(r, "prefill", **{"nvidia.com/gpu": "8"})
    [f] = _findings(r, "instance-gpus")
    assert "requests 8 GPUs but a g6e.12xlarge has 4" in f.message


def test_pod_taking_the_node_must_take_all_its_gpus(rendered):
    r = rendered("prod")   # 180 CPU of a p5.48xlarge's 192: no second pod fits
    _res(r, "decode", **{"nvidia.com/gpu": "4"})
    _edit_engine(r, "decode", tensor_parallel_size=4)
    [f] = _findings(r, "instance-gpus")
    assert "4 GPUs per node are paid for and idle" in f.message
    _res(r, "decode", cpu="40", memory="400Gi")       # now two such pods fit one node
    assert _findings(r, "instance-gpus") == []


def test_cpu_or_memory_beyond_the_instance(rendered):
    r = rendered("staging")
    _res(r, "prefill", memory="1200Gi")
    [f] = _findings(r, "instance-capacity")
    assert "1200 GiB memory but a p4d.24xlarge has 1152" in f.message


def test_tp_must_divide_the_pods_gpus(rendered):
    r = rendered("staging")
    _edit_engine(r, "decode", tensor_parallel_size=3)
    [f] = _findings(r, "tp-divides")
    assert "does not divide the pod's 8 GPUs" in f.message and f.file.endswith("overlays/staging/release.yaml")


def test_efa_count_within_the_instance(rendered):
    r = rendered("staging")
    _res(r, "decode", **{"vpc.amazonaws.com/efa": "32"})   # the efa component's p5 default on a p4d
    [f] = _findings(r, "instance-efa")
    assert "32 EFA interfaces but a p4d.24xlarge has 4" in f.message


def test_efa_only_on_efa_capable_types(rendered):
    r = rendered("prod")
    assert table()["g6e.xlarge"].efa == 0
    for name in ("prefill", "decode"):
        _pod(r, name)["nodeSelector"][TYPE] = "g6e.xlarge"
    fs = _findings(r, "efa-capable")
    assert len(fs) == 2 and "g6e.xlarge does not support EFA" in fs[0].message


def test_accelerator_type_matches_the_instance_gpu(rendered):
    r = rendered("staging")   # release.yaml says A100; put the phases on H100 nodes
    for name in ("prefill", "decode"):
        _pod(r, name)["nodeSelector"][TYPE] = "p5.48xlarge"
    fs = _findings(r, "accelerator-type")
    assert len(fs) == 2 and "accelerator A100 but p5.48xlarge has H100" in fs[0].message
    assert not _findings(rendered("staging"), "accelerator-type")   # A100 on p4d: fine


def test_unknown_or_unpinned_instance_type_is_a_warning(rendered):
    r = rendered("dev")
    _pod(r, "prefill")["nodeSelector"][TYPE] = "x9.huge"
    del _pod(r, "decode")["nodeSelector"][TYPE]
    fs = _findings(r, "instance-type")
    assert {f.severity for f in fs} == {"warning"} and len(fs) == 2


def _shareable_staging(r):
    """Staging with pods small enough that one prefill and one decode pod fit one p4d together."""
    for name in ("prefill", "decode"):
        _res(r, name, cpu="40", memory="400Gi", **{"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "2"})
        del _pod(r, name)["nodeSelector"]["pdops.dev/phase"]
    _edit_engine(r, "decode", tensor_parallel_size=4)
    return r


def test_prefill_and_decode_packed_on_one_efa_node(rendered):
    r = _shareable_staging(rendered("staging"))
    [f] = _findings(r, "pd-same-node")
    assert "can be packed on one node while using EFA" in f.message


def test_separate_node_groups_or_anti_affinity_keep_them_apart(rendered):
    r = _shareable_staging(rendered("staging"))
    _pod(r, "decode")["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"pdops.dev/phase": "prefill"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    assert _findings(r, "pd-same-node") == []
    r = _shareable_staging(rendered("staging"))
    _pod(r, "prefill")["nodeSelector"]["pdops.dev/phase"] = "prefill"
    _pod(r, "decode")["nodeSelector"]["pdops.dev/phase"] = "decode"
    assert _findings(r, "pd-same-node") == []


# ---- sizing ----------------------------------------------------------------------------------

def test_size_table_numbers_for_prod(rendered):
    t = size_table(rendered("prod"))
    pre, dec = t["phases"]
    assert pre["node"] == "p5.48xlarge" and pre["tp"] == 4 and dec["tp"] == 8
    assert pre["weights_per_device_gib"] == pytest.approx(70.6e9 * 2 / 4 / 2**30)
    assert pre["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2            # K and V, 80 layers, 8 heads x 128, bf16
    assert pre["kv_bytes_per_token_per_device"] == 2 * 80 * 2 * 128 * 2  # 8 KV heads over TP 4
    room = 80 * 0.92 - 70.6e9 * 2 / 4 / 2**30
    assert pre["kv_tokens_per_replica"] == int(room * 2**30 // (2 * 80 * 2 * 128 * 2))
    assert pre["max_sequences"] == pre["kv_tokens_per_replica"] // 65536
    assert "fits on one p5.48xlarge" in t["one_node"]


def test_phase_that_cannot_hold_the_weights_is_rejected(rendered):
    r = rendered("staging")
    _edit_engine(r, "prefill", tensor_parallel_size=1)   # 131.5 GiB of bf16 weights on one 40 GiB A100
    [f] = _findings(r, "size-weights")
    assert "prefill cannot hold the weights: 131.5 GiB per GPU at TP 1 > 36.8 GiB" in f.message


def test_kv_room_below_one_max_model_len_sequence_is_rejected(rendered):
    r = rendered("dev")
    _edit_engine(r, "prefill", gpu_memory_utilization=0.35)   # 16.8 GiB - 15.0 GiB of weights
    [f] = _findings(r, "size-kv")
    assert "max_model_len is 16384: vLLM refuses to start" in f.message


def test_kv_room_below_the_specs_load_is_a_warning(rendered):
    r = rendered("staging")
    load = r.spec.validation.load[0].model_copy(update={"concurrency": 4096})
    r.spec = r.spec.model_copy(update={"validation": r.spec.validation.model_copy(update={"load": [load]})})
    fs = _findings(r, "size-load")
    assert fs and {f.severity for f in fs} == {"warning"} and "c=4096" in fs[0].message


def test_model_spanning_nodes_gets_no_one_node_note(rendered):
    r = rendered("prod")
    ann = r.rayservice["metadata"]["annotations"]
    arch = json.loads(ann["pdops.dev/model-architecture"]) | {"parameters": 405e9}
    ann["pdops.dev/model-architecture"] = json.dumps(arch)
    assert _findings(r, "size-one-node") == [] and _findings(r, "size-weights")   # 405B bf16 at TP 4: 189 GiB/GPU


def test_sizing_from_a_rendered_manifest_file(rendered, tmp_path):
    from workflows.render.manifest import load_manifest

    path = tmp_path / "m.yaml"
    path.write_text(rendered("prod").text())
    t = size_table(load_manifest(str(path)))
    assert [p["phase"] for p in t["phases"]] == ["prefill", "decode"] and t["phases"][0]["load_tokens"] is None


def test_pinned_tables_are_dated_sourced_and_consistent():
    from workflows.pipeline.pricing import pinned_prices

    types = table()   # every row validated by InstanceType (extra fields refused)
    for family in ("g5.", "g6.", "g6e.", "p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-b200."):
        assert any(name.startswith(family) for name in types), family
    assert all(t.sources or t.note for t in types.values())          # a source, or a note saying it is missing
    prices = pinned_prices()
    assert prices["region"] and prices["pinned"]
    assert set(prices["prices"]) <= set(types) and all(p["source"] for p in prices["prices"].values())
    for env, it in (("dev", "g6e.12xlarge"), ("staging", "p4d.24xlarge"), ("prod", "p5.48xlarge")):
        assert it in types and it in prices["prices"], env
