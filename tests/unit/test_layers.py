"""Layers that go one way: the import contracts of pyproject.toml [tool.importlinter] hold, they see
imports inside functions, and no module imports another module's private (_name) names.

`make lint` runs `lint-imports` too; these tests keep the guarantees in the suite a contributor runs.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("workflows", "validation")


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_imports_inside_functions_are_in_the_graph_the_contracts_read():
    """An import moved into a function to hide a cycle must still count: grimp (import-linter's
    graph) records balance_advice's function-level import of advise_patch in workflows/pipeline/steps.py."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    details = graph.get_import_details(importer="workflows.pipeline.steps", imported="workflows.pipeline.advise_patch")
    source = (ROOT / "workflows" / "pipeline" / "steps.py").read_text().splitlines()
    assert details, "the function-level import is not in the graph"
    assert all(source[d["line_number"] - 1].startswith("    ") for d in details)   # indented: inside a function


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_no_module_imports_another_modules_private_names():
    """`from x import _name` couples a module to another's internals; share the name publicly instead
    (tests may import private names; they are not scanned)."""
    modules, found = _modules(), []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and node.module != name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {private} from {node.module}")
    assert found == []
