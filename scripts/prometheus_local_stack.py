"""The Prometheus metrics source on the REAL local stack (not a CI test; prints figures): a real
Prometheus (the Debian package's binary) scrapes Ray's metrics export port every second while a
bench runs on the candidate slot; the PromQL figures are printed beside the direct scrape's diff of
the same run.

    flock /work/wt/realstack.lock env PDOPS_HOME=/tmp/ph PDOPS_LOCAL_PORT=24400 \\
        .venv/bin/pdops rollout --overlay overlays/local
    flock /work/wt/realstack.lock env PDOPS_HOME=/tmp/ph PDOPS_LOCAL_PORT=24400 \\
        .venv/bin/python scripts/prometheus_local_stack.py [--requests 60]

On the local stack both slots export through one Ray port, so Prometheus' metric relabelling derives
what the PodMonitor's podTargetLabels give on Kubernetes: `pdops_dev_colour` and `pdops_dev_phase`
from the engines' ReplicaId (`<release>-<colour>#Prefill:<model>#<id>`, Ray Serve LLM's deployment
names).

Not yet run to the end: in the session that wrote it the candidate came up (rollout under the
lock, about 10 min on a loaded machine) but the lock was busy for the bench. The ReplicaId pattern
follows what tests/fakes/pd_queues.py serves; check it against the first real run.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import prometheus_support as prom  # noqa: E402
from validation import profiles  # noqa: E402
from validation.bench import BenchConfig, run_bench  # noqa: E402
from validation.prometheus import PrometheusSource  # noqa: E402
from validation.server_metrics import RAY_METRICS_LAG_S, Scraper  # noqa: E402
from workflows.targets.local import LocalTarget  # noqa: E402

RELABEL = [  # metric_relabel_configs: the PodMonitor's target labels, from the series' own ReplicaId
    {"source_labels": ["ReplicaId"], "regex": "[^#]*-(blue|green)#.*", "target_label": "pdops_dev_colour",
     "replacement": "$1"},
    {"source_labels": ["ReplicaId"], "regex": "[^#]*#Prefill:.*", "target_label": "pdops_dev_phase",
     "replacement": "prefill"},
    {"source_labels": ["ReplicaId"], "regex": "[^#]*#Decode:.*", "target_label": "pdops_dev_phase",
     "replacement": "decode"},
]


def figures(server) -> dict:
    out = {}
    for phase, hists in sorted((server.phases or {}).items()):
        for name, h in sorted(hists.items()):
            if h.count:
                out[f"{phase} {name}"] = {"count": round(h.count, 2), "mean_ms": round(h.mean_ms, 2),
                                          "p50_ms": round(h.p50_ms, 2), "p90_ms": round(h.p90_ms, 2),
                                          "p99_ms": round(h.p99_ms, 2)}
    kv = server.kv
    out["kv"] = {"external_kv_prompt_tokens": kv.external_kv_prompt_tokens if kv else None,
                 "nixl_failed_transfers": kv.nixl_failed_transfers if kv else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slot", choices=("stable", "candidate"), default="candidate")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--interval", default="1s", help="Prometheus scrape interval (default 1s)")
    args = ap.parse_args()
    target = LocalTarget()
    endpoint = target.endpoint(args.slot)
    record = getattr(target.status(), args.slot).release
    if record is None or not endpoint.metrics_url:
        print(f"no {args.slot} slot running: run `pdops rollout --overlay overlays/local` first", file=sys.stderr)
        return 2
    host = endpoint.metrics_url.split("//", 1)[1].split("/", 1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        with prom.PrometheusServer(Path(tmp), [prom.Target(host, "/metrics")], args.interval, RELABEL) as server:
            source = PrometheusSource(server.url, {"pdops_dev_colour": record.colour}, "pdops_dev_phase",
                                      lag_s=RAY_METRICS_LAG_S)
            reference = Scraper(endpoint.metrics_url, endpoint.metrics_labels or None,
                                endpoint.metrics_phases or None, lag_s=RAY_METRICS_LAG_S)
            reference.before()
            bench = run_bench(BenchConfig(endpoint.base_url, record.model, profiles.get("balanced"),
                                          concurrency=args.concurrency, requests=args.requests,
                                          metrics_url=endpoint.metrics_url, metrics_select=endpoint.metrics_labels or None,
                                          metrics_phases=endpoint.metrics_phases or None, metrics_lag_s=RAY_METRICS_LAG_S,
                                          tokenizer=endpoint.tokenizer, metrics_source=source, progress=print))
            direct = reference.window(0.0, 0.0, bench.requests_ok)
    assert bench.server is not None
    print(json.dumps({"prometheus": prom.version(), "scrape_interval": args.interval,
                      "requests_ok": bench.requests_ok, "errors": bench.errors,
                      "promql": figures(bench.server) if not bench.server.error else bench.server.error,
                      "direct": figures(direct) if not direct.error else direct.error}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
