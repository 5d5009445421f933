r"""A real A/A on the local stack: the same render released against itself, repeated (issue 21).

Nothing changes between the two sides, so every verdict but `promote` is a false rollback. The
candidate is the stable release's own render, deployed once into the candidate slot (the other
colour: its own engines, started fresh), then validated `--repeats` times exactly as `pdops release`
validates a candidate (steps.validate_slot: compat, every load in block pairs with the baseline,
which on the local target is the stable slot's engines, and the gate). Golden tokens and the diff are
switched off for the A/A (they compare outputs, not latency, and each would start a reference
engine). At the end the candidate is dropped (`rollback`: stable is untouched).

Prints, per repeat, the verdict, the failed checks, each vs_stable check's ratio and interval, the
block order's seed and the void pairs; then the count of false rollbacks. A figure, never a test:
latency from the tiny CPU model is a report.

    flock /work/wt/realstack.lock env PDOPS_HOME=/tmp/aa PDOPS_LOCAL_PORT=8300 \\
        .venv/bin/python scripts/bench_aa_local.py --repeats 10 --release-first --json aa.json

`--rejudge RUN...` decides again, with the gate as it is now, from the reports a run wrote (compat,
benches, the baseline's benches): the gate is a pure function of them, so a changed judge is
calibrated on the same real measurements without running the stack again.

What it does not capture: the spread between deployments (the candidate engines are started once;
`--redeploy` starts them afresh for every repeat, about 3 minutes more each).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workflows.pipeline import steps  # noqa: E402
from workflows.targets.base import TargetError  # noqa: E402
from workflows.targets.local import LocalTarget  # noqa: E402


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def vs_rows(decision: Any) -> list[dict[str, Any]]:
    return [{"check": c.check, "ok": c.ok, "verdict": c.verdict, "ratio": c.value, "interval": c.interval,
             "message": c.message} for c in decision.checks if c.check.startswith("vs_stable")]


def one(target: LocalTarget, spec: Any, rendered: Any, digest: str, runs: Path, k: int) -> dict[str, Any]:
    run = steps.new_run_dir(runs, f"aa{k}")
    started = time.monotonic()
    result = steps.validate_slot(target, spec, run, say, digest=digest, reference=None, rendered=rendered)
    d = result.decision
    inter = [b.interleaved for b in result.stable_benches or [] if b.interleaved is not None]
    return {"repeat": k, "verdict": d.verdict, "seconds": round(time.monotonic() - started, 1),
            "failed": [c.check for c in d.checks if not c.ok], "vs_stable": vs_rows(d), "run": str(run),
            "seeds": [i.seed for i in inter], "orders": [i.order for i in inter],
            "void": [v.model_dump() for i in inter for v in i.void]}


def backfill(bench: dict[str, Any]) -> dict[str, Any]:
    """samples.tpot_block for a report written before it existed: every request of a block has that
    block's label, and each kept block's summary (interleaved.per_block, in merge order) counts its TPOTs."""
    s, per_block = bench.get("samples") or {}, (bench.get("interleaved") or {}).get("per_block")
    if s.get("tpot") is not None and s.get("tpot_block") is None and per_block:
        labels = [b["block"] for b in per_block for _ in range((b.get("tpot_ms") or {}).get("count") or 0)]
        if len(labels) == len(s["tpot"]):
            s["tpot_block"] = labels
    return bench


def rejudge(spec: Any, run: Path, k: int) -> dict[str, Any]:
    """The gate's decision on a repeat's saved reports (golden tokens and the diff skipped, as in the run)."""
    from validation import gate

    def read(path: Path) -> Any:
        return json.loads(path.read_text())

    loads = range(len(spec.validation.load))
    benches = [backfill(read(next(run.glob(f"bench-{i}-*.json")))) for i in loads]
    stable = [backfill(read(p)) for i in loads for p in run.glob(f"stable-bench-{i}-*.json")]
    skipped = {"golden_tokens": "validation.reference is none", "diff": "validation.reference is none"}
    d = gate.decide(read(run / "compat.json"), benches, spec.slo, stable, skipped=skipped,
                    planned=spec.validation.load)
    inter = [b.get("interleaved") or {} for b in stable]
    return {"repeat": k, "verdict": d.verdict, "seconds": 0.0, "failed": [c.check for c in d.checks if not c.ok],
            "vs_stable": vs_rows(d), "run": str(run), "seeds": [i.get("seed") for i in inter],
            "orders": [i.get("order") for i in inter], "void": [v for i in inter for v in i.get("void") or []]}


def show(row: dict[str, Any]) -> None:
    print(f"repeat {row['repeat']}: {row['verdict']} ({row['seconds']} s) order {','.join(row['orders'])} "
          f"seed {row['seeds']}" + (f" FAILED {row['failed']}" if row["failed"] else "")
          + (f" void {len(row['void'])}" if row["void"] else ""), flush=True)
    for v in row["vs_stable"]:
        iv = v["interval"]
        interval = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv and None not in iv else "none"
        ratio = f"{v['ratio']:.3f}x" if isinstance(v["ratio"], float) else str(v["ratio"])
        print(f"    {v['check']}: {ratio} interval {interval} {v['verdict']} ok={v['ok']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--overlay", default=str(ROOT / "overlays" / "local"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--runs", default=str(ROOT / "runs" / "aa"))
    ap.add_argument("--release-first", action="store_true",
                    help="release the overlay first when it is not the stable release")
    ap.add_argument("--redeploy", action="store_true", help="start the candidate's engines afresh every repeat")
    ap.add_argument("--json", help="write every repeat's figures here")
    ap.add_argument("--rejudge", nargs="+", metavar="RUN", help="decide again from these runs' reports; no stack")
    args = ap.parse_args()
    target, runs = LocalTarget(), Path(args.runs)
    rendered = steps.load_release(args.overlay, None)
    spec = rendered.spec
    assert spec is not None
    spec = spec.model_copy(update={"validation": spec.validation.model_copy(update={"diff": False,
                                                                                  "reference": "none"})})
    if args.rejudge:
        rows = [rejudge(spec, Path(run), k) for k, run in enumerate(args.rejudge, 1)]
        for row in rows:
            show(row)
        return summary(rows, args.json)
    record = steps.record_of(rendered, steps.revision_of(Path(args.overlay)))
    stable = target.status().stable
    if stable.release is None or stable.release.digest != record.digest or stable.state != "ready":
        if not args.release_first:
            raise SystemExit("the overlay's render is not the serving stable release: pass --release-first")
        out = steps.release(Path(args.overlay), target, steps.new_run_dir(runs, "first"), say)
        print(f"first release: {out.verdict} in {out.seconds} s", flush=True)
    rows: list[dict[str, Any]] = []
    with target.session():
        try:
            for k in range(1, args.repeats + 1):
                if k == 1 or args.redeploy:
                    if k > 1:
                        target.rollback(["A/A: redeploy"], None, say)
                    target.apply(record, say)   # the stable render again, in the other colour
                    target.wait_ready(1200, say)
                rows.append(one(target, spec, rendered, record.digest, runs, k))
                show(rows[-1])
        except TargetError as exc:
            print(f"stopped: {exc}", flush=True)
        finally:
            target.rollback(["A/A finished: the candidate was the stable render"], None, say)
    return summary(rows, args.json)


def summary(rows: list[dict[str, Any]], out: str | None) -> int:
    false = [r["repeat"] for r in rows if r["verdict"] != "promote"]
    print(f"false rollbacks: {len(false)} of {len(rows)}" + (f" (repeats {false})" if false else ""), flush=True)
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
