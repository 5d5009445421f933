"""Print every function in workflows/ and validation/ longer than a limit, longest first.

Length is counted as the lines from `def` to the function's last line (ast end_lineno), docstring and
comments included, decorators not; nested functions and methods are counted on their own too.

    python scripts/function_lengths.py            # functions over 60 lines
    python scripts/function_lengths.py --over 40  # another limit

tests/unit/test_function_lengths.py holds the contract: none over 90 lines, at most three over 60.
"""
from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workflows", "validation")


@dataclass(frozen=True)
class FunctionLength:
    path: str     # relative to the repository root
    line: int
    name: str     # qualified within its module: Class.method, outer.inner
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} {self.lines} lines"


def _walk(node: ast.AST, path: str, prefix: str) -> list[FunctionLength]:
    out: list[FunctionLength] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            end = child.end_lineno or child.lineno
            out.append(FunctionLength(path, child.lineno, name, end - child.lineno + 1))
            out += _walk(child, path, name + ".")
        elif isinstance(child, ast.ClassDef):
            out += _walk(child, path, prefix + child.name + ".")
        else:
            out += _walk(child, path, prefix)
    return out


def function_lengths(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[FunctionLength]:
    """Every function and method under the packages, longest first."""
    found: list[FunctionLength] = []
    for pkg in packages:
        for file in sorted((root / pkg).rglob("*.py")):
            rel = str(file.relative_to(root))
            found += _walk(ast.parse(file.read_text(encoding="utf-8"), rel), rel, "")
    return sorted(found, key=lambda f: (-f.lines, f.path, f.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--over", type=int, default=60, help="print functions longer than this many lines (default 60)")
    args = parser.parse_args(argv)
    long = [f for f in function_lengths() if f.lines > args.over]
    for f in long:
        print(f)
    print(f"{len(long)} functions over {args.over} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
