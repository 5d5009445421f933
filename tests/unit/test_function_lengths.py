"""Functions a reader can hold (issue 23): in workflows/ and validation/ no function is over 90 lines
and at most three are over 60, counted by scripts/function_lengths.py (`def` line to last line,
methods and nested functions on their own). Split a function that breaks this into functions of one
concern rather than raising the limits.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES, LONG_LINES, MAX_LONG = 90, 60, 3


def _counter():
    spec = importlib.util.spec_from_file_location("function_lengths", ROOT / "scripts" / "function_lengths.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_no_function_is_over_90_lines_and_at_most_three_over_60():
    lengths = _counter().function_lengths(ROOT)
    over = [str(f) for f in lengths if f.lines > MAX_LINES]
    assert over == [], f"over {MAX_LINES} lines: split these into functions of one concern"
    long = [str(f) for f in lengths if f.lines > LONG_LINES]
    assert len(long) <= MAX_LONG, f"{len(long)} functions over {LONG_LINES} lines (at most {MAX_LONG}): {long}"


def test_the_counter_measures_def_to_last_line(tmp_path):
    pkg = tmp_path / "validation"
    pkg.mkdir()
    (tmp_path / "workflows").mkdir()
    (pkg / "m.py").write_text("class C:\n    def f(self):\n\n        return 1\n\n\n"
                              "def g():\n    def h():\n        pass\n    return h\n")
    found = {(f.name, f.line, f.lines) for f in _counter().function_lengths(tmp_path)}
    assert found == {("C.f", 2, 3), ("g", 7, 4), ("g.h", 8, 2)}


def test_a_long_function_is_reported(tmp_path):
    (tmp_path / "workflows").mkdir()
    (tmp_path / "validation").mkdir()
    (tmp_path / "workflows" / "w.py").write_text("def long():\n" + "    x = 1\n" * 91)
    (found,) = [f for f in _counter().function_lengths(tmp_path) if f.lines > MAX_LINES]
    assert str(found) == "workflows/w.py:1 long 92 lines"
