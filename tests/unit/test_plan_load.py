"""Per-request samples through the real harness: the fake's lognormal jitter arrives in the bench
JSON's samples, bounded, and `pdops plan-load` reads its spread back."""
from __future__ import annotations

import json

import numpy as np

from tests.fakes.known_timing_server import KnownTimingServer
from validation import metrics, profiles
from validation.bench import BenchConfig, run_bench
from validation.cli import main
from workflows.cli.main import main as pdops


def test_jittered_fake_to_samples_to_plan_load(tmp_path, capsys):
    with KnownTimingServer(first_token_delay=0.05, inter_token_delay=0.004, tokens=12, ttft_spread=0.4,
                           itl_spread=0.2, gap_spread=0.0, jitter_seed=3) as srv:
        b = run_bench(BenchConfig(srv.base_url, srv.model, profiles.get("balanced"), concurrency=8, requests=120, seed=1))
    s = b.samples
    assert len(s.ttft) == len(s.itl_counts) == 120 and sum(s.itl_counts) == len(s.itl) == 120 * 11
    # the configured spread comes back (client overhead adds ~1 ms to a 50 ms median)
    assert 0.3 < np.std(np.log(s.ttft)) < 0.5
    b.write(tmp_path / "pilot.json")
    assert main(["plan-load", str(tmp_path / "pilot.json"), "--regression", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "regression to catch +20% with 95%; 4 planned checks over 1 load(s)" in out
    ttft = next(line for line in out.splitlines() if line.startswith("| vs_stable_ttft_p90"))
    sd, blocks, need = (c.strip() for c in ttft.split("|")[2:5])
    # no blocks in a plain pilot: 4 batches of 30 consecutive requests stand in, and the plan says so
    assert float(sd) > 0 and blocks == "4 batches (30)" and int(need) >= 2
    assert "GPU-minutes per load at 16 GPUs per deployment" in out


def test_plan_reads_block_level_spread_and_needs_more_pairs_when_blocks_are_noisier():
    """The same requests with 5 % vs 15 % block-to-block noise: the plan needs more block pairs for the
    noisier pilot (what a plan from the request count alone cannot see), and each plan's pairs catch
    +15 % while one pair fewer does not."""
    from tests.unit.test_stats import world
    from validation import plan
    rng = np.random.default_rng(3)
    ids = np.repeat(np.arange(32), 50)
    plans = []
    for noise in (0.05, 0.15):
        sp = plan.block_spread(world(rng, 1, 32, noise=noise)[0].ravel(), ids, 0.9)
        k = plan.blocks_needed(sp, 1.1, 0.15, 0.05 / 9, 0.05)
        assert plan.caught_at(sp, k, 1.1, 0.05 / 9, 0.05) <= 1.15 < plan.caught_at(sp, k - 1, 1.1, 0.05 / 9, 0.05)
        plans.append(k)
    assert plans[1] > 1.5 * plans[0], plans
    assert plan.blocks_needed(sp, 1.1, 0.05, 0.01, 0.05) is None     # within the factor: never rolled back
    assert plan.gpu_minutes(1600, 0.3, 16) == (16.0, 512.0)


def test_samples_are_bounded_by_whole_requests(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_ITL_SAMPLES", 50)
    recs = [{"index": i, "warmup": False, "status": 200, "error": None, "sent": 0.0, "first_content": 0.1,
             "chunk_times": [0.1 + 0.01 * k for k in range(11)], "last_chunk": 0.2, "usage": {"completion_tokens": 11}}
            for i in range(30)]
    s = metrics.samples(recs)
    assert s["truncated"] == {"requests_kept": 5, "requests": 30, "itl_gaps": 300}
    assert len(s["ttft"]) == 5 and s["itl_counts"] == [10] * 5 and len(s["itl"]) == 50


def test_gate_cli_inconclusive_override(tmp_path):
    """16 requests cannot bound a p90: the spec's default fails it; pd-canary's override decides by
    the point estimate and says so."""
    rng = np.random.default_rng(0)
    ttft = (100 * rng.lognormal(0, 0.3, 16)).tolist()
    b = {"kind": "bench", "profile": "balanced", "load": {"concurrency": 4}, "requests_total": 16, "requests_ok": 16,
         "errors": 0,
         "error_rate": 0.0, "client_health": {"client_bottleneck": False}, "itl_level": "token",
         "ttft_ms": metrics.summary(ttft), "samples": {"ttft": ttft}}
    (tmp_path / "bench.json").write_text(json.dumps(b))
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "release.yaml").write_text(
        "name: pd-llm\nmodel: {id: m, source: s}\nslo: {prefill: {ttft_p90_ms: 1000}, kv_transfer: ignored}\n")
    (tmp_path / "compat.json").write_text(json.dumps({"ok": True, "passed": 1, "required_failures": [], "cases": []}))
    args = ["gate", "--compat", str(tmp_path / "compat.json"), "--bench", str(tmp_path / "bench.json"), "--release", str(tmp_path / "env" / "release.yaml")]
    assert pdops(args + ["--out", str(tmp_path / "a"), "--json", str(tmp_path / "a.json")]) == 1   # `pdops gate`
    check = next(c for c in json.loads((tmp_path / "a.json").read_text())["checks"] if c["check"] == "ttft_p90_ms")
    assert check["verdict"] == "inconclusive" and "16 samples cannot bound a p90" in check["message"]
    assert pdops(args + ["--out", str(tmp_path / "b"), "--inconclusive", "point_estimate"]) == 0
