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
from tests.kube_support import LOCAL_NS, record, release, target  # noqa: F401
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


def _stub_validation(monkeypatch, ttft_ms) -> None:
    """The measurement is the only stub: `pdops validate --slot stable` gets a decision with TTFT `ttft_ms()`."""
    def validate_slot(target, spec, run, progress, **kwargs):
        return steps.Validation(decision=_canary_decision(ttft_ms()),
                                report=ReportFiles(json=str(run / "report.json"), markdown=str(run / "report.md")),
                                benches=[], release="pd-llm")
    monkeypatch.setattr(steps, "validate_slot", validate_slot)


def _scenario(manifests, fault: WriteFault | None, tmp_path, monkeypatch) -> tuple[dict, list[str], list[int]]:
    """A promoted release, then the three canary runs (a failed try retried once, the fault cleared).
    Returns canary.json at the end, the Watch's problems and every try's exit code."""
    # figures differ run to run: the sums show a double count
    _stub_validation(monkeypatch, lambda: 300.0 + 7 * RUNS.index(os.environ["PDOPS_RUN_ID"]))
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


def test_a_writer_storing_between_the_steps_read_and_write_keeps_its_entry_after_the_409(
        manifests, tmp_path, monkeypatch, capsys):
    """Issue 22: the step's history write reads canary.json (with its resourceVersion), builds the new
    history and PUTs it. Here another writer stores a run of its own in between, so the PUT gets 409
    and HistoryStore.update reads again: the entry must be built from THAT read, and both runs stored.
    (Before the fix the step built its history from a read made before the write and wrote it again
    on the retry, so the other writer's run was overwritten: this test failed with
    ['pd-canary-1764950400'] stored.) The step's verdict must count the runs stored (2), not the
    runs it first read (1).

    Emulated: the other writer, as a store update inside the API server (tests/fakes/kube/store.py)
    run by the server's before_write hook just before the CLI's first PUT of the history ConfigMap;
    today the run's Lease keeps such a writer out, so it stands for a writer that does not hold it.
    The 409 is the store's own (a PUT whose resourceVersion is stale, as k8s.io/apiserver
    registry/store.go Update refuses it), not a WriteFault. Real: the CLI, the kubernetes client, the
    target and HistoryStore.update's retry, the canary's bookkeeping (validation/canary.py)."""
    from validation import canary

    other, mine = "pd-canary-elsewhere", RUNS[0]
    _stub_validation(monkeypatch, lambda: 300.0)
    cluster = start_cluster(kubeconfig=tmp_path / "kubeconfig")
    try:
        release(target(cluster), record(manifests))
        raced: list[str] = []

        def other_writer_first(req) -> None:
            if (req.method == "PUT" and req.path.endswith(f"/configmaps/{HISTORY}")
                    and req.agent.startswith(CLI_AGENT) and not raced):
                configmaps = cluster.store_resource("configmaps")   # the store directly: inside the API server
                cm = cluster.store.get(configmaps, LOCAL_NS, HISTORY)
                stored = json.loads(cm["data"]["canary.json"]) if cm["data"].get("canary.json") else None
                digest = json.loads(cm["data"]["slots.json"])["stable"]["digest"]
                history, _ = canary.record(stored, digest, other, 0.0,
                                           canary.latency_stats(_canary_decision(301.0)))
                cm["data"]["canary.json"] = json.dumps(history)
                cluster.store.update(configmaps, LOCAL_NS, HISTORY, cm, "other-writer")
                raced.append(cm["metadata"]["resourceVersion"])
        cluster.faults.before_write.append(other_writer_first)
        watch = Watch()
        cluster.store.listeners.append(watch)
        _lease(cluster, "start", mine)
        capsys.readouterr()
        code = _validate(cluster, mine, tmp_path / "run", monkeypatch)
        out = capsys.readouterr()
        _lease(cluster, "end", mine)
        puts = [r for r in cluster.api.requests if r.method == "PUT" and r.path.endswith(f"/configmaps/{HISTORY}")
                and r.agent.startswith(CLI_AGENT)]
        stored = json.loads(cluster.objects("configmaps", LOCAL_NS)[HISTORY]["data"]["canary.json"])
    finally:
        cluster.close()
    assert raced, "the other writer never ran: the CLI sent no PUT of the history ConfigMap"
    assert len(puts) == 2, f"expected the 409'd PUT and its retry, got {len(puts)}"
    assert code == 0, out.out + out.err
    assert sorted(r["run"] for r in stored["recent"]) == sorted([other, mine]), stored["recent"]
    assert stored["runs_since_reset"] == 2 and stored["keys"]["c8/ttft_p90_ms"]["n"] == 2
    assert watch.problems == []
    assert "canary: 2 runs since the serving release" in out.out + out.err   # the verdict of the stored history
