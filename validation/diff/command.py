"""`pdops diff`: the candidate vs a single-engine reference, request by request.

    pdops diff --base-url URL --reference-url URL --model M [--scenarios FILE]... [--known FILE]
               [--json FILE] [--api-key-env VAR]

Exit 0 when no case differs unexpectedly, 1 when one does (or a case could not be compared),
2 on bad input (a flag, a scenarios file, a known-divergences file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from validation.cli_args import http_url, output_file, positive, write_json
from validation.diff import known as known_mod, matrix, runner, scenarios
from validation.diff.models import Case, Report
from validation.errors import InputError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def coverage_lines(cov: dict) -> list[str]:
    """The fields with no case (and why), and any field neither covered nor explained."""
    lines = []
    for api, c in cov.items():
        lines.append(f"[diff] {api}: {len(c['covered'])} request fields covered, {len(c['uncovered'])} without a case:")
        lines += [f"[diff]   {f}: {matrix.UNCOVERED[api][f]}" for f in c["uncovered"]]
        if c["unexplained"]:
            lines.append("[diff]   NO CASE AND NO REASON (new in the installed packages?): "
                         + ", ".join(c["unexplained"]))
    return lines


def collect_cases(scenario_files: list[str], builtin: bool = True) -> list[Case]:
    """The built-in matrix, then every scenario file's cases; a name used twice is bad input."""
    out = matrix.cases() if builtin else []
    names = {c.name for c in out}
    for f in scenario_files:
        for case in scenarios.load(f):
            if case.name in names:
                raise InputError(f, case.source.rsplit(":", 1)[-1], f"case name {case.name!r} is used twice")
            names.add(case.name)
            out.append(case)
    return out


def diff(base_url: str, reference_url: str, model: str, *, scenario_files: Sequence[str] = (),
         known_file: str | None = None, api_key: str | None = None, timeout: float = 120.0,
         progress: Callable[[str], None] = _err, builtin: bool = True,
         fields: dict[str, dict[str, set[str]]] | None = None) -> Report:
    """What `pdops diff` and the release call: bad input raises InputError before any request. `fields`:
    the schemas' fields for the coverage (matrix.coverage), None to read the installed ones."""
    cases = collect_cases(list(scenario_files), builtin)
    known = known_mod.load(known_file) if known_file else []
    cov = matrix.coverage(fields) if builtin else {}
    for line in coverage_lines(cov):
        progress(line)
    uncovered = {api: {f: matrix.UNCOVERED[api][f] for f in c["uncovered"]} for api, c in cov.items()}
    progress(f"[diff] {len(cases)} cases: {base_url} vs reference {reference_url}")
    return runner.run(cases, base_url, reference_url, model, api_key=api_key, known=known, timeout=timeout,
                      progress=progress, uncovered=uncovered)


def cmd_diff(args) -> int:
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        _err(f"warning: ${args.api_key_env} is empty")
    report = diff(args.base_url, args.reference_url, args.model, scenario_files=args.scenarios or [],
                  known_file=args.known, api_key=api_key, timeout=args.timeout, builtin=not args.no_matrix)
    print(runner.table(report))
    write_json(args.json, json.loads(report.model_dump_json()))
    return 0 if report.summary.ok else 1


def register(sub) -> None:
    p = sub.add_parser("diff",
                       help="differential suite: the candidate vs a single-engine reference, request by request",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, type=http_url, help="the candidate, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--reference-url", required=True, type=http_url,
                   help="one plain (non-disaggregated) engine of the same model, e.g. http://127.0.0.1:8001/v1")
    p.add_argument("--model", required=True, help="the model id both serve")
    p.add_argument("--scenarios", action="append", metavar="FILE",
                   help="JSONL of request bodies (optional name, expect); repeatable")
    p.add_argument("--known", metavar="FILE", help="YAML of known divergences (reported as known, not blocking)")
    p.add_argument("--json", type=output_file, help="write the report JSON here")
    p.add_argument("--api-key-env", help="environment variable holding the API key (sent to both)")
    p.add_argument("--timeout", type=positive, default=120.0, help="seconds per request (default 120)")
    p.add_argument("--no-matrix", action="store_true", help="run only --scenarios, not the built-in matrix")
    p.set_defaults(func=cmd_diff)

