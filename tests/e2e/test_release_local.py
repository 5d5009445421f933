"""`pdops release` on the REAL local stack: Ray Serve LLM prefill/decode (vLLM CPU, NIXL) on 127.0.0.1.

Nothing is emulated. One Ray is brought up for this module (own PDOPS_HOME and ports) and stopped
at its end. A good release must promote; then a candidate that cannot meet its SLO must roll back
while the stable release keeps answering live requests. Asserts on verdicts, slot state, token
counts, finish_reason, determinism, golden tokens and KV-transfer counters; never on generated
text or absolute latency (figures from the tiny CPU model are reports).
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import STABLE, LiveTraffic, changed_overlay, complete, pdops, status

pytestmark = pytest.mark.e2e


def test_good_release_is_promoted_and_serves_at_the_stable_route(stack, promoted):
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr[-3000:]
    out = json.loads(promoted.stdout)
    assert out["verdict"] == "promote"
    run = ROOT / out["run"]

    golden = json.loads((run / "golden.json").read_text())
    assert golden["ok"] and golden["matched"] == golden["prompts"] == 4 and golden["tokens_compared"] == 64

    bench = json.loads(next(run.glob("bench-0-*.json")).read_text())
    assert bench["requests_ok"] == 16 and bench["errors"] == 0
    assert bench["lengths"]["output_mismatches"] == 0          # every answer had the asked-for length
    kv = bench["server"]["kv"]
    assert kv["external_kv_prompt_tokens"] > 0 and kv["nixl_failed_transfers"] == 0

    compat = json.loads((run / "compat.json").read_text())
    assert not compat["required_failures"]

    st = status(stack)
    assert st["stable"]["state"] == "ready" and st["stable"]["release"]["digest"] == out["digest"]
    assert st["candidate"]["release"] is None
    assert [h["verdict"] for h in st["history"]] == ["promote"]

    first, again = complete(STABLE, 6), complete(STABLE, 6)
    choice = first["choices"][0]
    assert choice["finish_reason"] == "length" and first["usage"]["completion_tokens"] == 6
    assert choice["token_ids"] == again["choices"][0]["token_ids"]   # temperature 0 + seed: deterministic


def test_same_revision_again_is_a_no_op(stack, promoted):
    proc = pdops(stack, "release", "--overlay", "overlays/local", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"] == "unchanged"


def test_candidate_missing_its_slo_rolls_back_while_stable_serves(stack, promoted, tmp_path):
    assert promoted.returncode == 0
    before = status(stack)["stable"]["release"]["digest"]
    # 2 block pairs, not the overlay's 4: the question here is the rollback while stable serves, and 2 pairs
    # still run the paired baseline path on the real stack (each pair about 13 s of the tier's CPU-bound minutes)
    overlay = changed_overlay(tmp_path, 32, slo__vs_stable__blocks=2)
    spec_file = overlay / "release.yaml"
    spec_file.write_text(spec_file.read_text().replace("ttft_p90_ms: 5000", "ttft_p90_ms: 1"))
    with LiveTraffic() as users:
        proc = pdops(stack, "release", "--overlay", str(overlay), "--json")
    print(f"stable availability during the SLO-failing release: {users}")
    assert proc.returncode == 1, proc.stdout
    out = json.loads(proc.stdout)
    assert out["verdict"] == "rollback" and any("ttft" in r for r in out["reasons"])
    assert users.sent >= 10 and users.ok == users.sent

    st = status(stack)
    assert st["stable"]["release"]["digest"] == before and st["stable"]["state"] == "ready"
    assert st["candidate"]["release"] is None
    assert [h["verdict"] for h in st["history"]][-1] == "rollback"
    assert st["last_good"]["digest"] == before
