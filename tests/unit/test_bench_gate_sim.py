"""scripts/bench_gate_sim.py --quick: the simulator runs the real gate end to end and prints its table."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def test_quick_simulation_prints_every_row(capsys):
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_gate_sim.py"
    spec = importlib.util.spec_from_file_location("bench_gate_sim", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("A/A (unchanged candidate)", "uniform +15%", "p90-only +15% TTFT, median unchanged",
                "vs the user-facing stable under user load"):
        assert row in out, out
    # 16 pairs of 50 requests: a +15 % regression is rolled back in every quick release
    uniform = next(line for line in out.splitlines() if line.startswith("| uniform +15% (TTFT"))
    assert uniform.split("|")[2].strip() == "100.0%", uniform
    # interim looks (slo.statistics.stop_early): an A/A never stops early; a 3x candidate always does
    aa = next(line for line in out.splitlines() if line.startswith("| A/A (unchanged"))
    clear = next(line for line in out.splitlines() if line.startswith("| uniform 3x"))
    assert aa.split("|")[5].strip() == "0 of 6" and clear.split("|")[5].strip() == "6 of 6", (aa, clear)
    assert clear.split("|")[2].strip() == "100.0%", clear
