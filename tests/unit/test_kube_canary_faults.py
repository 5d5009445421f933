"""The canary's run history on Kubernetes survives a fault at every write (issue 22).

pd-canary's `pdops validate --slot stable` records each run in canary.json of the ConfigMap
`pdops-history-<release>` (workflows/pipeline/canary.py, HistoryStore.update: written with the
resourceVersion read, under the run's Lease). Three scheduled runs (PDOPS_RUN_ID, as Argo names each
CronWorkflow run) are driven through the CLI, each a new process's worth of state (`pdops run start`,
`pdops validate --slot stable`, `pdops run end`), with a fault at EVERY write they send, in turn, of
each kind tests/fakes/kube/server.py WriteFault emulates: a 500 (not stored), a 409 Conflict (not
stored), a 504 timeout whose write was stored anyway, and the process killed right after a write
was stored. A step that did not exit 0 is run again with the same run id, as Argo retries the step
inside the same Workflow (the retry is a child node of that Workflow, so PDOPS_RUN_ID is the same).
Asserted for every case:
- after every change the API server commits, canary.json holds each run id at most once and still
  holds every run id it ever held (no write loses an earlier run);
- the end state is the fault-free one: the three run ids once each, in order, the running sums
  (runs since reset, per-check n) counted once per run.

Emulated: the API server (tests/fakes/kube/store.py: resourceVersion, 409 on a stale PUT as
k8s.io/apiserver registry/store.go Update does), KubeRay (the promoted release's RayService) and the
validation run itself (steps.validate_slot returns a fixed decision: the measurement is not what is
tested here; tests/unit/test_kube_canary.py covers what it judges by). Real: the CLI, the `kubernetes`
client, the target, the Lease and the canary's CUSUM bookkeeping (validation/canary.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from tests.conftest import ROOT
from tests.fakes.kube import start_cluster
from tests.fakes.kube.server import FAULT_KINDS, WriteFault
from tests.kube_support import LOCAL_NS, manifests, record, release, target  # noqa: F401
from tests.unit.test_local_target import _canary_decision
from validation.reports.release import ReportFiles
from workflows.cli.main import main
from workflows.pipeline import steps

RUNS = ("pd-canary-1764950400", "pd-canary-1764952200", "pd-canary-1764954000")   # 30 min apart
HISTORY = "pdops-history-pd-llm"
# The CLI's client keeps the kubernetes client's default user agent ("OpenAPI-Generator/<version>/python");
# the test's own set-up client is "pdops-test" and is never faulted.
CLI_AGENT = "OpenAPI-Generator"
WRITES = 3    # one PUT of the history ConfigMap per run (Leases are not counted: WriteFault)
CASES = [(n, kind) for n in range(1, WRITES + 1) for kind in FAULT_KINDS]


def _run_ids(cm: dict | None) -> list[str]:
    data = (cm or {}).get("data") or {}
    return [r["run"] for r in json.loads(data["canary.json"])["recent"]] if data.get("canary.json") else []


@dataclass
class Watch:
    """After every committed change of the history ConfigMap: no run twice, no run ever lost."""

    ever: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __call__(self, key, obj) -> None:
        if key[0].plural != "configmaps" or key[2] != HISTORY:
            return
        ids = _run_ids(obj)
        if len(ids) != len(set(ids)):
            self.problems.append(f"a run recorded twice: {ids}")
        lost = [r for r in self.ever if r not in ids]
        if lost:
            self.problems.append(f"runs lost by a write: {lost} (now {ids})")
        self.ever += [r for r in ids if r not in self.ever]


def _validate(cluster, run_id: str, run_dir, monkeypatch) -> int:
    monkeypatch.setenv("PDOPS_RUN_ID", run_id)
    return main(["validate", "--slot", "stable", "--target", "kubernetes", "--overlay", str(ROOT / "overlays" / "local"),
                 "--namespace", LOCAL_NS, "--kubeconfig", str(cluster.kubeconfig), "--out", str(run_dir)])


def _lease(cluster, action: str, run_id: str) -> None:
    assert main(["run", action, "--run-id", run_id, "--namespace", LOCAL_NS,
                 "--kubeconfig", str(cluster.kubeconfig)]) == 0


def _scenario(manifests, fault: WriteFault | None, tmp_path, monkeypatch) -> tuple[dict, list[str], list[int]]:
    """A promoted release, then the three canary runs (a failed try retried once, the fault cleared).
    Returns canary.json at the end, the Watch's problems and every try's exit code."""
    def validate_slot(target, spec, run, progress, **kwargs):
        n = RUNS.index(os.environ["PDOPS_RUN_ID"])    # figures differ run to run: the sums show a double count
        return steps.Validation(decision=_canary_decision(300.0 + 7 * n),
                                report=ReportFiles(json=str(run / "report.json"), markdown=str(run / "report.md")),
                                benches=[], release="pd-llm")
    monkeypatch.setattr(steps, "validate_slot", validate_slot)
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    try:
        release(target(cluster), record(manifests))
        watch = Watch()
        cluster.store.listeners.append(watch)
        cluster.faults.write = fault
        codes: list[int] = []
        for run_id in RUNS:
            _lease(cluster, "start", run_id)
            codes.append(_validate(cluster, run_id, tmp_path / f"run-{run_id}", monkeypatch))
            if codes[-1] != 0:
                cluster.faults.write = None      # the retry is a new pod: a killed client is gone with its pod
                codes.append(_validate(cluster, run_id, tmp_path / f"run-{run_id}-retry", monkeypatch))
            _lease(cluster, "end", run_id)
        cm = cluster.objects("configmaps", LOCAL_NS)[HISTORY]
        return json.loads(cm["data"]["canary.json"]), watch.problems, codes
    finally:
        cluster.close()


def _comparable(canary: dict) -> dict:
    """canary.json without the wall-clock times of the runs."""
    return {**canary, "recent": [{k: v for k, v in r.items() if k != "at"} for r in canary["recent"]]}


@pytest.fixture(scope="module")
def clean(manifests, tmp_path_factory):
    """The three runs without a fault: canary.json, and the writes the CLI sent."""
    mp = pytest.MonkeyPatch()
    try:
        writes = WriteFault(10**6, "500", agent=CLI_AGENT)    # counts, never fires
        canary, problems, codes = _scenario(manifests, writes, tmp_path_factory.mktemp("clean"), mp)
    finally:
        mp.undo()
    assert problems == [] and codes == [0, 0, 0]
    return canary, writes.seen


def test_the_fault_free_runs_record_each_run_once_and_send_the_writes_counted(clean):
    canary, writes = clean
    assert writes == WRITES, "the canary runs send another number of writes: update WRITES so each is faulted"
    assert [r["run"] for r in canary["recent"]] == list(RUNS) and canary["runs_since_reset"] == len(RUNS)
    assert {k: v["n"] for k, v in canary["keys"].items()} == {"c8/ttft_p90_ms": len(RUNS)}


@pytest.mark.parametrize(("nth", "kind"), CASES, ids=[f"write{n}-{kind}" for n, kind in CASES])
def test_a_fault_at_every_history_write_converges_to_one_entry_per_run_and_loses_none(
        manifests, clean, tmp_path, monkeypatch, nth, kind):
    fault = WriteFault(nth, kind, agent=CLI_AGENT)
    canary, problems, codes = _scenario(manifests, fault, tmp_path, monkeypatch)
    assert fault.fired is not None, f"write #{nth} was never sent"
    where = f"{kind} at write #{nth} ({fault.fired.method} {fault.fired.path}; exit codes {codes})"
    assert problems == [], f"{where}: {problems}"
    assert _comparable(canary) == _comparable(clean[0]), f"{where}: the retried runs ended elsewhere"
    if kind == "409":     # not stored: HistoryStore.update reads again and writes once more, in the same try
        assert codes == [0, 0, 0], where
    else:                 # the API server's 500/504, or the client gone: exit 75, Argo's retry code
        assert codes.count(75) == 1 and len(codes) == len(RUNS) + 1 and codes.count(0) == len(RUNS), where
