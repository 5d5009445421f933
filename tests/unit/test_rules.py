"""One test per cross-layer rule: it fires on a deliberately broken render and not on the overlays."""
from __future__ import annotations

import pytest
import yaml

from tests.conftest import OVERLAYS
from workflows.checks.rules import lint


def _rules(r) -> set[str]:
    return {f.rule for f in lint(r)}


def _edit_serve(r, edit):
    rs = r.rayservice
    config = yaml.safe_load(rs["spec"]["serveConfigV2"])
    edit(config["applications"][0]["args"])
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    return r


def _group(r, name):
    return next(g for g in r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name)


def _worker(r, name):
    return _group(r, name)["template"]["spec"]["containers"][0]


def _kv(args, phase):
    return args[f"{phase}_config"]["engine_kwargs"]["kv_transfer_config"]


@pytest.mark.parametrize("env", OVERLAYS)
def test_committed_overlays_are_clean(rendered, env):
    # Only notes remain: the guide's "fits on one node" (size-one-node) for the GPU overlays.
    assert [f for f in lint(rendered(env)) if f.severity != "info"] == []


def test_model_mismatch(rendered):
    r = _edit_serve(rendered(), lambda a: a["decode_config"]["model_loading_config"].update(model_id="other"))
    [f] = [f for f in lint(r) if f.rule == "model-mismatch"]
    assert f.file.endswith("overlays/prod/release.yaml") and "model_id" in f.field


@pytest.mark.parametrize("role", [None, "kv_both", "kv_consumer"])
def test_kv_role_missing_deprecated_or_swapped(rendered, role):
    def edit(a):
        kv = _kv(a, "prefill")
        kv.pop("kv_role") if role is None else kv.update(kv_role=role)
    findings = [f for f in lint(_edit_serve(rendered(), edit)) if f.rule == "kv-role"]
    assert len(findings) == 1 and "prefill" in findings[0].message and "kv_producer" in findings[0].fix


def test_kv_connector_mismatch_and_missing(rendered):
    r = _edit_serve(rendered(), lambda a: _kv(a, "decode").update(kv_connector="LMCacheConnectorV1"))
    assert "kv-connector" in _rules(r)
    r = _edit_serve(rendered(), lambda a: a["prefill_config"]["engine_kwargs"].pop("kv_transfer_config"))
    assert any(f.rule == "kv-connector" and "prefill" in f.message for f in lint(r))


def test_connector_that_moves_no_kv_is_a_warning_not_a_block(rendered):
    """A warning: the release still runs and its golden tokens fail it (tests/e2e measured that)."""
    def edit(a):
        for phase in ("prefill", "decode"):
            _kv(a, phase).update(kv_connector="DecodeBenchConnector")
    [f] = [f for f in lint(_edit_serve(rendered(), edit)) if f.rule == "kv-connector"]
    assert f.severity == "warning" and "dummy values" in f.message and "NixlConnector" in f.fix


def test_tp_order(rendered):
    r = _edit_serve(rendered(), lambda a: a["prefill_config"]["engine_kwargs"].update(tensor_parallel_size=16))
    assert "tp-order" in _rules(r)


def test_gpu_fit_replicas_times_tp(rendered):
    r = _edit_serve(rendered(), lambda a: a["decode_config"]["deployment_config"]["autoscaling_config"].update(max_replicas=3))
    [f] = [f for f in lint(r) if f.rule == "gpu-fit"]
    assert "24 GPUs" in f.message and f.field.endswith(".maxReplicas") and "raise maxReplicas to 3" in f.fix


def test_gpu_fit_missing_gpu_limit(rendered):
    r = rendered()
    del _worker(r, "prefill")["resources"]["limits"]["nvidia.com/gpu"]
    assert any(f.rule == "gpu-fit" and "requests no GPUs" in f.message for f in lint(r))


def test_gpu_fit_skips_cpu(rendered):
    assert "gpu-fit" not in _rules(rendered("local"))


def test_efa_without_libfabric_falls_back_to_tcp(rendered):
    def edit(a):
        for phase in ("prefill", "decode"):
            _kv(a, phase)["kv_connector_extra_config"]["backends"] = ["UCX"]
    findings = [f for f in lint(_edit_serve(rendered(), edit)) if f.rule == "efa-backend"]
    assert len(findings) == 2 and "TCP" in findings[0].message


def test_libfabric_without_efa_resource(rendered):
    r = rendered("dev")  # no EFA component
    _edit_serve(r, lambda a: [_kv(a, p)["kv_connector_extra_config"].update(backends=["LIBFABRIC"]) for p in ("prefill", "decode")])
    assert any(f.rule == "efa-resource" and "requests no vpc.amazonaws.com/efa" in f.message for f in lint(r))


def test_efa_without_toleration(rendered):
    r = rendered()
    _group(r, "decode")["template"]["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert any(f.rule == "efa-resource" and "taint" in f.message for f in lint(r))


def test_ray_version_differs_from_image(rendered):
    r = rendered()
    r.rayservice["spec"]["rayClusterConfig"]["rayVersion"] = "2.59.0"
    assert "ray-version" in _rules(r)


def test_max_model_len_above_model_limit(rendered):
    r = _edit_serve(rendered(), lambda a: a["decode_config"]["engine_kwargs"].update(max_model_len=200000))
    assert any(f.rule == "max-model-len" and "131072" in f.message for f in lint(r))


def test_placement_unpinned_group_and_bundle(rendered):
    r = rendered()
    del _group(r, "prefill")["rayStartParams"]["resources"]
    assert any(f.rule == "placement" and "prefill_node" in f.message for f in lint(r))
    r = _edit_serve(rendered(), lambda a: a["decode_config"].update(placement_group_config={"bundle_per_worker": {"GPU": 1}}))
    assert any(f.rule == "placement" and "decode placement bundles" in f.message for f in lint(r))


def test_placement_missing_group(rendered):
    r = rendered()
    groups = r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    groups[:] = [g for g in groups if g["groupName"] != "decode"]
    assert any(f.rule == "placement" and "'decode'" in f.message for f in lint(r))


def test_replicas_edit_that_rayservice_ignores(rendered):
    r = rendered()
    _group(r, "decode")["replicas"] = 3
    [f] = [f for f in lint(r) if f.rule == "replicas-ignored"]
    assert f.field.endswith("workerGroupSpecs[1].replicas")


def test_missing_resources(rendered):
    r = rendered()
    del _worker(r, "decode")["resources"]["requests"]
    assert any(f.rule == "resources" and "requests" in f.field for f in lint(r))


@pytest.mark.parametrize("image", ["rayproject/ray-llm:latest", "rayproject/ray-llm"])
def test_unpinned_image(rendered, image):
    r = rendered()
    _worker(r, "prefill")["image"] = image
    assert "image-pinned" in _rules(r)


def test_digest_pinned_image_is_fine(rendered):
    r = rendered()
    _worker(r, "prefill")["image"] = "rayproject/ray-llm:2.60.0-py311-cu128@sha256:" + "a" * 64
    assert "image-pinned" not in _rules(r)


@pytest.mark.parametrize("env", ["prod", "local"])
def test_kv_compat_phases_whose_nixl_hash_would_differ(rendered, env):
    # vLLM nixl/metadata.py compute_nixl_compatibility_hash: dtype is hashed, so a decode engine left
    # at the default while prefill sets float32 (overlays/local) fails its handshake at deploy time
    r = rendered(env)
    assert "kv-compat" not in _rules(r)
    r = _edit_serve(r, lambda a: a["decode_config"]["engine_kwargs"].update(dtype="float16"))
    [f] = [f for f in lint(r) if f.rule == "kv-compat"]
    assert "dtype" in f.field and f.file.endswith(f"overlays/{env}/release.yaml") and f.severity == "error"
    # left unset on one side means vLLM's default: "auto" on both is the same hash
    r = _edit_serve(rendered(env), lambda a: [a[f"{p}_config"]["engine_kwargs"].pop("dtype", None)
                                              for p in ("prefill", "decode")])
    assert "kv-compat" not in _rules(r)
