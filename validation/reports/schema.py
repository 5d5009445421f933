"""JSON Schemas of the reports, generated from the models and committed in validation/schemas/.

    pdops schema [--out DIR]     write <name>.schema.json for every report (default validation/schemas)
    pdops schema --check         exit 1 naming every committed schema that differs from the models

Users feed these reports to their own dashboards; the committed schemas are the contract, and
tests/unit/test_report_schemas.py fails when a model changes without its schema (and validates
reports that real producer runs wrote against them).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from validation.reports import BenchReport, CompatReport, Decision, DiffReport, GoldenReport, ReleaseOutcome, RunReport

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
RULE = ("A figure that was not measured is null, never 0; the report's `missing` map (where it has one) names "
        "why, keyed by the field's dotted path, a reason on a prefix covering everything under it.")

# file stem -> (model, the file a producer writes it to)
REPORTS: dict[str, tuple[type[BaseModel], str]] = {
    "compat": (CompatReport, "pdops compat --json FILE; RUN/compat.json"),
    "bench": (BenchReport, "pdops bench --json FILE; RUN/bench-<i>-<profile>.json"),
    "diff": (DiffReport, "pdops diff --json FILE; RUN/diff.json"),
    "decision": (Decision, "pdops gate --json FILE; `decision` in RUN/report.json"),
    "golden": (GoldenReport, "RUN/golden.json"),
    "run": (RunReport, "RUN/report.json (pdops release, pdops validate, pdops gate --out)"),
    "release": (ReleaseOutcome, "RUN/release.json; pdops release --json"),
}


def generate() -> dict[str, dict[str, Any]]:
    """Every report's schema, as it is committed (serialization mode: what the files hold)."""
    out = {}
    for name, (model, where) in REPORTS.items():
        schema = model.model_json_schema(mode="serialization", by_alias=True)
        head = {"$schema": DIALECT, "$id": f"https://pdops.dev/schemas/{name}.schema.json",
                "description": f"{(model.__doc__ or model.__name__).strip().splitlines()[0]} "
                               f"Written by: {where}. {RULE}"}
        out[name] = {**head, **{k: v for k, v in schema.items() if k != "description"}}
    return out


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(folder: Path = SCHEMA_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in generate().items():
        path = folder / f"{name}.schema.json"
        path.write_text(text(schema), encoding="utf-8")
        paths.append(path)
    return paths


def drift(folder: Path = SCHEMA_DIR) -> list[str]:
    """Committed schemas that differ from the models (missing, edited, or stale)."""
    out = []
    for name, schema in generate().items():
        path = folder / f"{name}.schema.json"
        if not path.is_file():
            out.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text(schema):
            out.append(f"{path}: differs from validation/reports/ (regenerate: pdops schema)")
    return out


def cmd_schema(args: argparse.Namespace) -> int:
    folder = Path(args.out) if args.out else SCHEMA_DIR
    if args.check:
        bad = drift(folder)
        for line in bad:
            print(line)
        if not bad:
            print(f"{len(REPORTS)} report schemas in {folder} match the models")
        return 1 if bad else 0
    for path in write(folder):
        print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("schema", help="write (or --check) the JSON Schemas of the reports (validation/schemas/)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder to write to (default: validation/schemas in this checkout)")
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on any difference")
    p.set_defaults(func=cmd_schema)
