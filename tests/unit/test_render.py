"""Golden renders, kustomize merge behaviour, and the committed merge-key schema."""
from __future__ import annotations

import os

import pytest
import yaml

from tests.conftest import OVERLAYS, ROOT
from workflows.render.kustomize_openapi import render_document
from workflows.render.serve_config import PHASE_RESOURCE


def test_every_environment_has_an_overlay():
    assert {"local", "dev", "staging", "prod"} <= set(OVERLAYS)


@pytest.mark.parametrize("env", OVERLAYS)
def test_golden_render(rendered_overlays, env):
    golden = ROOT / "tests" / "golden" / f"{env}.yaml"
    text = rendered_overlays[env].text()
    if os.environ.get("PDOPS_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden for {env}: run PDOPS_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py"
    assert text == golden.read_text(), f"render of overlays/{env} drifted from {golden}; review and re-bless"


def test_openapi_schema_matches_generator():
    committed = (ROOT / "kustomize" / "openapi" / "rayservice.json").read_text()
    assert committed == render_document(), "regenerate kustomize/openapi/rayservice.json from workflows.render.kustomize_openapi"


def _groups(r):
    return {g["groupName"]: g for g in r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


def test_per_phase_patch_leaves_the_other_phase_and_base_fields_intact(rendered_overlays):
    base_like = _groups(rendered_overlays["local"])
    prod = _groups(rendered_overlays["prod"])
    assert list(prod) == ["prefill", "decode"]
    for name in ("prefill", "decode"):
        pod = prod[name]["template"]["spec"]
        container = pod["containers"][0]
        # merged by name, not replaced: base env, preStop and volumes survive the overlay's patches
        assert {e["name"] for e in container["env"]} >= {"VLLM_HOST_IP", "FI_PROVIDER"}
        assert container["lifecycle"]["preStop"]["exec"]["command"][-1] == "ray stop"
        assert [v["name"] for v in pod["volumes"]] == ["dshm"]
        assert pod["nodeSelector"]["pdops.dev/phase"] == name
        assert PHASE_RESOURCE[name] in prod[name]["rayStartParams"]["resources"]
        assert base_like[name]["template"]["spec"]["containers"][0]["name"] == container["name"]
    assert prod["prefill"]["maxReplicas"] == 1 and prod["decode"]["maxReplicas"] == 2


def test_serve_config_lands_in_rayservice(rendered_overlays):
    config = yaml.safe_load(rendered_overlays["local"].rayservice["spec"]["serveConfigV2"])
    args = config["applications"][0]["args"]
    assert config["applications"][0]["import_path"] == "ray.serve.llm:build_pd_openai_app"
    assert args["prefill_config"]["engine_kwargs"]["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert args["decode_config"]["engine_kwargs"]["kv_transfer_config"]["kv_role"] == "kv_consumer"
    assert args["prefill_config"]["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"


@pytest.mark.parametrize("env", OVERLAYS)
def test_every_overlay_validates_against_pinned_schemas(rendered_overlays, env):
    from tests.conftest import SCHEMAS
    from workflows.checks.schema import validate_objects

    if not SCHEMAS.is_dir():
        pytest.skip(f"pinned schemas not found at {SCHEMAS}")
    findings = validate_objects(rendered_overlays[env].objects, SCHEMAS, env)
    assert [f.render() for f in findings if f.severity != "info"] == []
    # only the PodMonitor (monitoring component) has no pinned schema
    unvalidated = sorted(f.field.split()[0] for f in findings if f.severity == "info")
    kustomization = yaml.safe_load((ROOT / "overlays" / env / "kustomization.yaml").read_text())
    monitored = any(c.endswith("components/monitoring") for c in kustomization.get("components") or [])
    assert monitored == (env in {"staging", "prod", "prod-multinode"})
    assert unvalidated == (["PodMonitor/pd-llm"] if monitored else [])


def test_schema_catches_a_misspelled_worker_group_field(rendered):
    from tests.conftest import SCHEMAS
    from workflows.checks.schema import validate_objects

    if not SCHEMAS.is_dir():
        pytest.skip(f"pinned schemas not found at {SCHEMAS}")
    r = rendered("dev")
    group = r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
    group["maxReplica"] = group.pop("maxReplicas")
    fields = [f.field for f in validate_objects(r.objects, SCHEMAS, "dev") if f.severity == "error"]
    assert any("workerGroupSpecs[1]" in f for f in fields)
