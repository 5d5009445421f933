"""`pdops size` (does the model fit each phase) and `pdops cost` (what a benchmark run cost)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from validation.reports.cost import Cost, PhaseCost, Rates
from workflows.errors import InputError


def _fmt(v: Any, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def print_size(table: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    arch = table["architecture"]
    if arch:
        n = arch["parameters"]
        count = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
        print(f"model: {count} parameters,", end="", file=out)
        print(f" {arch['layers']} layers, {arch['kv_heads']} KV heads "
              f"x {arch['head_dim']}, {arch['dtype']} ({arch.get('source') or 'spec'})", file=out)
    head = ("phase", "node", "TP", "PP", "nodes/repl", "repl", "mem/dev GiB", "util", "weights/dev GiB", "KV B/token",
            "KV room GiB", "KV tokens/repl", "max_model_len", "max seqs", "load tokens")
    rows = [head] + [(p["phase"], p["node"], str(p["tp"]), str(p["pp"]), str(p["nodes_per_replica"]),
                      str(p["replicas"]),
                      _fmt(p["device_memory_gib"], ".1f"),
                      _fmt(p["memory_utilization"], ".2f"), _fmt(p["weights_per_device_gib"], ".2f"),
                      _fmt(p["kv_bytes_per_token"]), _fmt(p["kv_room_gib"], ".2f"), _fmt(p["kv_tokens_per_replica"]),
                      _fmt(p["max_model_len"]), _fmt(p["max_sequences"]),
                      _fmt(p["load_tokens"]) + (f" ({p['load']})" if p["load"] else ""))
                     for p in table["phases"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    if not table["phases"]:
        print("no sizing: the model's architecture or the phases' instance types are unknown", file=out)
    gpu = any(p["memory_utilization"] for p in table["phases"])
    print("one node: " + (table["one_node"] or ("the model does not fit on one node of its phase: P/D across nodes "
                          "is what the guide recommends it for" if gpu else "not evaluated (CPU, no instance type)")),
          file=out)
    for f in table["findings"]:
        if f["rule"] != "size-one-node":
            print(f"{f['severity']}[{f['rule']}] {f['message']}", file=out)


def cmd_size(args: argparse.Namespace) -> int:
    from workflows.checks.sizing import size_table
    from workflows.render.manifest import load_release

    table = size_table(load_release(args.overlay, args.file))
    if args.json:
        json.dump(table, sys.stdout, indent=2)
        print()
    else:
        print_size(table)
    return 1 if any(f["severity"] == "error" for f in table["findings"]) else 0


def print_cost(costs: list[tuple[str, Cost]], out: Any = None) -> None:
    out = out or sys.stdout
    for label, c in costs:
        t = c.throughput
        print(f"{label}: {_fmt(t.input_tokens_per_s, '.1f')} input tok/s, {_fmt(t.output_tokens_per_s, '.1f')} output "
              f"tok/s, {_fmt(t.requests_per_s, '.2f')} req/s over {_fmt(t.wall_s, '.1f')} s", file=out)
        if not c.priced or c.total is None:
            print(f"  not priced: {c.reason}", file=out)
            continue
        print(f"  {'':8} {'nodes':>6} {'$/hour':>9} {'$/M input':>10} {'$/M output':>11} {'$/1k req':>9}", file=out)
        rows: list[tuple[str, Rates]] = [*c.phases.items(), ("total", c.total)]
        for name, p in rows:
            print(f"  {name:8} {_fmt(p.nodes, '6.2f') if isinstance(p, PhaseCost) else '':>6} {p.usd_per_hour:9.2f} "
                  f"{_fmt(p.usd_per_million_input_tokens, '10.2f'):>10} "
                  f"{_fmt(p.usd_per_million_output_tokens, '11.2f'):>11} "
                  f"{_fmt(p.usd_per_1k_requests, '9.3f'):>9}", file=out)
        for name, ph in c.phases.items():
            print(f"  {name}: {ph.nodes:g} x {ph.instance_type} at ${ph.usd_per_node_hour}/h ({ph.price_source})",
                  file=out)
    print(f"formula: {costs[0][1].formula if costs else ''}", file=out)


def cmd_cost(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from workflows.pipeline.pricing import bench_cost
    from workflows.render.manifest import load_release

    rendered = load_release(args.overlay, None)
    assert rendered.spec is not None
    costs = []
    for path in args.bench:
        try:
            bench = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(path, "", f"cannot read the bench JSON: {exc}", "pass a bench-*.json of a run") from None
        if not isinstance(bench, dict) or "wall_s" not in bench:
            raise InputError(path, "wall_s", "not a benchmark result", "pass a bench-*.json written by pdops bench")
        try:
            costs.append((path, bench_cost(bench, rendered.spec, rendered)))
        except ValidationError as exc:   # JSON of another shape (validation/reports/bench.py)
            e = exc.errors()[0]
            raise InputError(path, ".".join(map(str, e["loc"])), f"not a benchmark result: {e['msg']}",
                             "pass a bench-*.json written by pdops bench") from None
    if args.json:
        json.dump([{"bench": p, **c.json_data()} for p, c in costs], sys.stdout, indent=2)
        print()
    else:
        print_cost(costs)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("size", help="weights, KV room and max sequences per phase; whether the model fits one node")
    p.add_argument("overlay", nargs="?", help="overlay directory (or a rendered manifest file)")
    p.add_argument("-f", "--file", help="a rendered manifest file, '-' for stdin")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_size)
    p = sub.add_parser("cost", help="$ per million tokens and per 1,000 requests of benchmark runs on an "
                                    "overlay's nodes")
    p.add_argument("overlay", help="overlay directory whose instance types and prices apply")
    p.add_argument("--bench", nargs="+", required=True, help="bench JSON file(s) (pdops bench / a release run)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cost)
