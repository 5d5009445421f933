"""Report files, profiles, and the CLI end to end against the fake server."""
from __future__ import annotations

import json

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles, report
from validation.cli import main, register
from validation.config import SLO, PrefillSLO, Validation
from validation.errors import InputError
from validation.gate import decide
from validation.release_inputs import ReleaseInputs


def _bench(c, ttft):
    return {"kind": "bench", "profile": "balanced", "load": {"concurrency": c},
            "ttft_ms": {"p50": ttft, "p90": ttft, "p99": ttft}, "itl_ms": {"p90": 5}, "tpot_ms": {"p90": 5},
            "requests_ok": 4, "errors": 0, "error_rate": 0.0, "goodput_rps": 1.0,
            "client_health": {"client_bottleneck": False},
            "samples": {"ttft": [ttft, ttft + 1, ttft + 2], "tpot": [5, 6], "itl": [4, 5, 6]}}


def test_report_files_written(tmp_path):
    benches = [_bench(1, 100), _bench(8, 150)]
    d = decide({"ok": True, "required_failures": [], "cases": [
        {"name": "models_list", "status": "pass", "required": True, "detail": ""}]},
        benches, SLO(kv_transfer="ignored", prefill=PrefillSLO(ttft_p90_ms=120)), None)
    assert d.verdict == "rollback"
    files = report.write(tmp_path, d, None, benches)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"report.json", "summary.md", "ttft_cdf.png", "tpot_cdf.png", "itl_cdf.png",
            "latency_vs_load_balanced.png"} <= names
    for f in files.plots:
        assert open(f, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "summary.md").read_text()
    assert "ROLLBACK" in md and "ttft" in md.lower()
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "rollback"


def test_profiles_lengths_and_determinism():
    for name in ("long-prompt-short-output", "short-prompt-long-output", "balanced"):
        prof = profiles.get(name)
        make = profiles.request_factory(prof, seed=1)
        a, b = make(3), make(3)
        assert a == b
        n = len(a["messages"][0]["content"].split())
        assert abs(n - prof.prompt_tokens) <= prof.prompt_tokens * prof.spread + 1
        assert a["max_tokens"] > 0
    assert profiles.get("long-prompt-short-output").prompt_tokens > profiles.get("short-prompt-long-output").prompt_tokens
    with pytest.raises(KeyError):
        profiles.get("nope")


def test_verify_lengths_reports_mismatch():
    recs = [{"index": 0, "warmup": False, "usage": {"completion_tokens": 5, "prompt_tokens": 200},
             "expected_output_tokens": 8, "expected_prompt_tokens": 100}]
    v = profiles.verify_lengths(recs)
    assert v["output_mismatches"] == 1 and v["prompt_mismatch"]


def test_cli_bench_compat_gate(tmp_path, capsys):
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.002, tokens=16) as s:
        rc = main(["bench", "--base-url", s.base_url, "--model", "fake-model", "--prompt-tokens", "20",
                   "--output-tokens", "16", "--concurrency", "2", "--requests", "4", "--warmup", "1",
                   "--metrics-url", f"http://127.0.0.1:{s.port}/metrics", "--json", str(tmp_path / "b.json")])
        assert rc == 0
        rc = main(["compat", "--base-url", s.base_url, "--model", "fake-model", "--json", str(tmp_path / "c.json")])
        assert rc == 0
    b = json.loads((tmp_path / "b.json").read_text())
    for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(b[k]) >= {"mean", "p50", "p90", "p95", "p99", "max"}
    assert b["requests_ok"] == 4 and b["errors"] == 0 and "goodput_rps" in b and "client_health" in b
    assert b["server"]["kv"]["external_kv_prompt_tokens"] == 0
    assert b["lengths"]["output_mismatches"] == 0
    out = capsys.readouterr().out
    assert "ttft" in out and "models_list" in out

    gate_argv = ["gate", "--compat", str(tmp_path / "c.json"), "--bench", str(tmp_path / "b.json"),
                 "--release", str(tmp_path / "release.yaml"), "--out", str(tmp_path / "out")]
    # validation/ reads no release.yaml: without a reader (the bare validation CLI) gate is bad input
    with pytest.raises(InputError, match="reads no release.yaml"):
        main(gate_argv)
    # the typed inputs a release.yaml gives the gate (workflows/pipeline/pricing.py release_inputs builds them)
    import argparse
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd", required=True), read_release=lambda path: ReleaseInputs(
        slo=SLO(prefill=PrefillSLO(ttft_p90_ms=500)), validation=Validation(), price=lambda benches: None))
    args = ap.parse_args(gate_argv)
    rc = args.func(args)
    # KV transfer is required by default and the fake shows none: rollback
    assert rc == 1
    assert "KV transfer" in capsys.readouterr().out
    assert (tmp_path / "out" / "summary.md").exists()


def test_register_sets_func():
    import argparse
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd"))
    for argv in (["compat", "--base-url", "http://127.0.0.1:8000/v1", "--model", "m"],
                 ["bench", "--base-url", "http://127.0.0.1:8000/v1", "--model", "m", "--profile", "balanced", "--concurrency", "1"],
                 ["gate", "--bench", "f", "--release", "r", "--out", "o"]):
        assert callable(ap.parse_args(argv).func)
