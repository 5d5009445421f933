"""Sizing inputs (spec architecture, a local model's config.json), `pdops size` / `pdops cost`, and the
cost of a benchmark run measured on the known-timing fake, including the vs_stable cost gate."""
from __future__ import annotations

import json
import struct

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles
from validation.bench import BenchConfig, run_bench
from validation.config import SLO, VsStable
from validation.gate import decide
from workflows.cli.main import main
from workflows.errors import InputError
from workflows.pipeline.pricing import bench_cost
from workflows.render.sizing import resolve
from workflows.spec.release import parse_spec

BASE = {"name": "x", "model": {"id": "m", "source": "m"}}


def test_architecture_fields_are_validated_with_the_field_named():
    with pytest.raises(InputError) as exc:
        parse_spec(BASE | {"model": {"id": "m", "source": "m", "architecture": {
            "parameters": 7e9, "layers": 0, "kv_heads": 8, "head_dim": 128}}}, "release.yaml")
    assert exc.value.field == "model.architecture.layers"
    with pytest.raises(InputError) as exc:
        parse_spec(BASE | {"cost": {"prices": {"p5.48xlarge": -1}}}, "release.yaml")
    assert exc.value.field == "cost.prices.p5.48xlarge"


def _safetensors(path, tensors):
    header = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_architecture_from_a_local_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256,
        "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16"}))
    _safetensors(tmp_path / "model.safetensors", {"a": [1000, 256], "b": [3, 7]})
    arch = resolve(parse_spec(BASE | {"model": {"id": "m", "source": str(tmp_path)}}, "release.yaml"))
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.dtype) == (3, 2, 32, "bfloat16")
    assert arch.parameters == 1000 * 256 + 21          # counted from the safetensors header
    assert resolve(parse_spec(BASE, "release.yaml")) is None   # a hub id: the spec must say


def test_size_command_json(capsys, monkeypatch):
    monkeypatch.delenv("PDOPS_SCHEMA_DIR", raising=False)   # the pinned schemas in the repository
    assert main(["size", "overlays/dev", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert [p["node"] for p in t["phases"]] == ["g6e.12xlarge"] * 2
    assert t["phases"][1]["weights_per_device_gib"] == pytest.approx(8.03e9 * 2 / 2 / 2**30)
    assert "fits on one g6e.12xlarge" in t["one_node"]


@pytest.fixture(scope="module")
def fake_bench():
    # 64-word prompts, 32 tokens out, 20 ms to first token then 5 ms per token: about 0.18 s a request.
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.005, tokens=32) as s:
        return run_bench(BenchConfig(s.base_url, "fake-model", profiles.custom(64, 32), concurrency=4, requests=24)).json_data()


def test_bench_reports_input_tokens_from_usage(fake_bench):
    assert fake_bench["requests_ok"] == 24
    assert fake_bench["input_tokens"]["mean"] >= 32    # the fake counts prompt words
    assert fake_bench["input_token_throughput_tps"] == pytest.approx(
        fake_bench["input_tokens"]["mean"] * 24 / fake_bench["wall_s"])


def test_cost_of_a_fake_run_on_prod_nodes(rendered, fake_bench):
    r = rendered("prod")
    c = bench_cost(fake_bench, r.spec, r)
    assert c.priced
    pre, dec = c.phases["prefill"], c.phases["decode"]
    assert (pre.nodes, dec.nodes) == (1, 2)               # worker group replicas, each takes a p5
    assert pre.usd_per_hour == pytest.approx(55.04) and c.total.usd_per_hour == pytest.approx(3 * 55.04)
    out_tps = fake_bench["output_token_throughput_tps"]
    assert c.total.usd_per_million_output_tokens == pytest.approx(3 * 55.04 / (out_tps * 3600) * 1e6)
    assert c.total.usd_per_1k_requests == pytest.approx(
        3 * 55.04 / (fake_bench["request_throughput_rps"] * 3600) * 1e3)


def test_spec_price_override_and_missing_price(rendered, fake_bench):
    r = rendered("prod")
    spec = r.spec.model_copy(update={"cost": r.spec.cost.model_copy(update={"prices": {"p5.48xlarge": 30.0}})})
    assert bench_cost(fake_bench, spec, r).phases["decode"].usd_per_hour == 60.0
    other = r.spec.model_copy(update={"cost": r.spec.cost.model_copy(update={"region": "eu-west-1"})})
    c = bench_cost(fake_bench, other, r)
    assert not c.priced and "set cost.prices.p5.48xlarge" in c.reason
    local = rendered("local")
    assert not bench_cost(fake_bench, local.spec, local).priced


def test_cost_command_prints_the_table(capsys, tmp_path, fake_bench, monkeypatch):
    monkeypatch.delenv("PDOPS_SCHEMA_DIR", raising=False)   # the pinned schemas in the repository
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(fake_bench))
    assert main(["cost", "overlays/prod", "--bench", str(path)]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "$/M output" in out and "3 x" not in out and "2 x p5.48xlarge" in out


def test_vs_stable_gates_on_cost(rendered, fake_bench):
    r = rendered("prod")
    cand = dict(fake_bench, cost=bench_cost(fake_bench, r.spec, r))
    slower = dict(fake_bench, request_throughput_rps=fake_bench["request_throughput_rps"] * 2)
    stable = dict(slower, cost=bench_cost(slower, r.spec, r))           # stable served twice as many req/s
    slo = SLO(vs_stable=VsStable(cost=1.5), kv_transfer="ignored", client_health="ignored")
    d = decide({"required_failures": []}, [cand], slo, [stable])
    [check] = [c for c in d.checks if c.check == "vs_stable_cost"]
    assert not check.ok and check.value == pytest.approx(2.0)
    d = decide({"required_failures": []}, [cand], slo.model_copy(update={"vs_stable": VsStable(cost=2.5)}), [stable])
    assert [c.ok for c in d.checks if c.check == "vs_stable_cost"] == [True]


def test_gate_prices_runs_on_the_release_overlay_and_reports_cost(tmp_path, fake_bench, monkeypatch):
    """`pdops gate` (the Kubernetes pipeline's step) prices `pdops bench` runs on the overlay's nodes."""
    monkeypatch.delenv("PDOPS_SCHEMA_DIR", raising=False)   # the pinned schemas in the repository
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(fake_bench))
    main(["gate", "--bench", str(path), "--release", "overlays/staging/release.yaml", "--out", str(tmp_path / "r")])
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    cost = report["benches"][0]["cost"]
    assert cost["priced"] and cost["total"]["usd_per_hour"] == pytest.approx(2 * 21.96)
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "## Cost" in summary and "| total | - | 43.92 |" in summary


def test_a_release_prices_each_run_on_its_nodes(tmp_path, monkeypatch):
    """`pdops release` on the fake: the local overlay put on priced CPU nodes (an instance type the
    spec prices itself); every bench file of the run carries its cost."""
    import shutil

    import yaml

    from tests.conftest import ROOT
    from tests.unit.test_release_flow import RecordingTarget, endpoint, run

    monkeypatch.delenv("PDOPS_SCHEMA_DIR", raising=False)   # the pinned schemas in the repository
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    overlay = tmp_path / "overlays" / "local"
    shutil.copytree(ROOT / "overlays" / "local", overlay)
    spec = yaml.safe_load((overlay / "release.yaml").read_text())
    spec["slo"]["kv_transfer"] = "ignored"
    spec["validation"]["load"] = [{"profile": "balanced", "concurrency": 2, "requests": 4, "warmup_requests": 0}]
    spec["cost"] = {"prices": {"m7i.4xlarge": 0.8064}}
    (overlay / "release.yaml").write_text(yaml.safe_dump(spec))
    k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    k["patches"] = [{"target": {"kind": "RayService"}, "patch": yaml.safe_dump({
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "any"},
        "spec": {"rayClusterConfig": {"workerGroupSpecs": [
            {"groupName": g, "template": {"spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "m7i.4xlarge"}}}}
            for g in ("prefill", "decode")]}}})}]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.005, tokens=8, model="pdops-tiny") as srv:
        out, folder = run(overlay, RecordingTarget(endpoint(srv)), tmp_path)
    assert out.verdict == "promote", out.reasons
    cost = json.loads(next(folder.glob("bench-0-*.json")).read_text())["cost"]
    assert cost["priced"] and cost["total"]["usd_per_hour"] == pytest.approx(2 * 0.8064)
    assert cost["phases"]["prefill"]["price_source"] == "release.yaml cost.prices"
    assert "## Cost" in (folder / "summary.md").read_text()
