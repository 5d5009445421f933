"""`steps.release` end to end on a recording target whose candidate is the known-timing fake server.

What is real: the overlay render and checks, the compat suite, the latency harness, the gate and
the reports. What stands in: the target (it records calls and serves the fake's endpoint), so these
tests pin the release's ordering promises: nothing is applied before the checks pass, and every
way out after apply ends in rollback. tests/e2e runs the same flow on the real local stack.
"""
from __future__ import annotations

import errno
import json
import os
from contextlib import nullcontext
from pathlib import Path

import pytest
import yaml

from tests.conftest import local_overlay
from tests.fakes.fault_proxy import FaultProxy
from tests.fakes.known_timing_server import KnownTimingServer
from tests.fakes.starved_client import starve
from workflows.errors import InputError
from workflows.pipeline import steps
from workflows.targets.base import Endpoint, SlotStatus, TargetError, TargetStatus


class RecordingTarget:
    kind = "recording"

    def __init__(self, endpoint: Endpoint, ready_error: TargetError | None = None) -> None:
        self.endpoint_, self.ready_error = endpoint, ready_error
        self.calls: list[str] = []
        self.candidate = self.stable = None

    def session(self):
        return nullcontext()

    def status(self) -> TargetStatus:
        return TargetStatus(target=self.kind, stable=SlotStatus(slot="stable", release=self.stable,
                                                                state="ready" if self.stable else "absent"),
                            candidate=SlotStatus(slot="candidate", release=self.candidate))

    def apply(self, record, progress):
        self.calls.append("apply")
        self.candidate = record.model_copy(update={"colour": "blue"})
        return self.candidate

    def wait_ready(self, timeout_s, progress):
        self.calls.append("wait_ready")
        if self.ready_error:
            raise self.ready_error
        return self.endpoint_

    def endpoint(self, slot):
        return self.endpoint_

    def promote(self, reasons, report, progress, *, baseline=None):
        self.calls.append("promote")
        self.baseline = baseline
        self.stable, self.candidate = self.candidate, None
        return self.stable

    def rollback(self, reasons, report, progress, *, to_previous=False, regressed=None):
        self.calls.append("rollback")
        self.candidate = None
        return "dropped candidate"

    def history(self):
        return []

    def reference(self, record, prompts, max_tokens, progress):
        return None

    def reference_server(self, record, progress):
        self.reference_servers = getattr(self, "reference_servers", 0) + 1
        return nullcontext(getattr(self, "reference_url", None))


@pytest.fixture(scope="module")
def server():
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.005, tokens=8, model="pdops-tiny") as srv:
        yield srv


@pytest.fixture
def overlay(tmp_path):
    """overlays/local with light validation that the fake can serve (it moves no KV, so KV is ignored)."""
    def edit(spec):
        spec["slo"]["kv_transfer"] = "ignored"
        spec["slo"].pop("vs_stable", None)   # the tests that compare with a baseline set it themselves
        spec["validation"]["load"] = [{"profile": "balanced", "concurrency": 2, "requests": 4, "warmup_requests": 0}]
    return local_overlay(tmp_path, edit)


def edit(overlay, **changes):
    spec = yaml.safe_load((overlay / "release.yaml").read_text())
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    (overlay / "release.yaml").write_text(yaml.safe_dump(spec))


def run(overlay, target, tmp_path):
    folder = steps.new_run_dir(tmp_path / "runs", "local")
    return steps.release(overlay, target, folder, lambda m: None, revision="test"), folder


def endpoint(server):
    return Endpoint(base_url=server.base_url, metrics_url=server.base_url.removesuffix("/v1") + "/metrics")


def test_passing_candidate_is_promoted_with_a_report(server, overlay, tmp_path, monkeypatch):
    # About ordering, not client health (tested in test_validation_harness): a busy 2-core CI box
    # can lag the client's event loop past its limit and void the run.
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target = RecordingTarget(endpoint(server))
    out, folder = run(overlay, target, tmp_path)
    assert out.verdict == "promote", out.reasons
    assert target.calls == ["apply", "wait_ready", "promote"]
    saved = json.loads((folder / "release.json").read_text())
    assert saved["verdict"] == "promote" and saved["digest"].startswith("sha256:")
    # the gate compared the benches with the loads release.yaml plans (steps passes validation.load)
    checks = json.loads((folder / "report.json").read_text())["decision"]["checks"]
    loads = [(c["ok"], c["message"]) for c in checks if c["check"] == "loads"]
    assert loads == [(True, "loads: 1 of 1 planned loads measured")]
    assert (folder / "summary.md").exists() and (folder / "compat.json").exists()
    assert yaml.safe_load_all((folder / "manifest.yaml").read_text())


def test_unmeetable_slo_rolls_back_and_says_why(server, overlay, tmp_path):
    edit(overlay, slo__prefill__ttft_p90_ms=0.001)
    target = RecordingTarget(endpoint(server))
    out, _ = run(overlay, target, tmp_path)
    assert out.verdict == "rollback"
    assert target.calls == ["apply", "wait_ready", "rollback"]
    assert any("ttft" in r and "p90" in r for r in out.reasons)


def test_inconclusive_run_is_extended_until_proven(server, overlay, tmp_path, monkeypatch):
    """slo.statistics.inconclusive: extend: 30 requests cannot bound a p90, 60 prove it.

    30 requests cannot bound a p90 at 97.5% (two planned looks): the same load runs again, 60 prove it.
    Requests are independent clusters here: this test is about the looks; a run without blocks is
    otherwise cut into batches (tests/unit/test_judge.py)."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    monkeypatch.setattr("validation.stats.batches", lambda n: list(range(n)))
    edit(overlay, slo__statistics={"inconclusive": "extend", "max_looks": 2},
         slo__prefill={"ttft_p90_ms": 5000}, slo__decode={}, validation__load=[
             {"profile": "balanced", "concurrency": 2, "requests": 30, "warmup_requests": 0}])
    out, folder = run(overlay, RecordingTarget(endpoint(server)), tmp_path)
    assert out.verdict == "promote", out.reasons
    bench = json.loads((folder / "bench-0-balanced.json").read_text())
    assert bench["requests_ok"] == 60 and [lk["requests_ok"] for lk in bench["looks"]] == [30, 30]
    check = next(c for c in json.loads((folder / "report.json").read_text())["decision"]["checks"]
                 if c["check"] == "ttft_p90_ms")
    assert check["verdict"] == "pass" and check["interval"][1] <= 5000 and check["confidence"] == 0.975


def test_inconclusive_at_the_last_look_rolls_back(server, overlay, tmp_path, monkeypatch):
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    edit(overlay, slo__statistics={"inconclusive": "extend", "max_looks": 2})
    out, folder = run(overlay, RecordingTarget(endpoint(server)), tmp_path)
    assert out.verdict == "rollback"
    assert json.loads((folder / "bench-0-balanced.json").read_text())["requests_ok"] == 8
    assert any("the cap" in r for r in out.reasons), out.reasons


def test_bad_spec_applies_nothing(server, overlay, tmp_path):
    edit(overlay, prefill__tensor_parallel_size="two")
    target = RecordingTarget(endpoint(server))
    with pytest.raises(InputError, match="prefill.tensor_parallel_size"):
        run(overlay, target, tmp_path)
    assert target.calls == []


def test_cross_layer_findings_block_before_apply(server, overlay, tmp_path):
    edit(overlay, prefill__tensor_parallel_size=2)   # prefill TP above decode's: the tp-order rule
    target = RecordingTarget(endpoint(server))
    out, folder = run(overlay, target, tmp_path)
    assert out.verdict == "blocked" and any("tp-order" in r for r in out.reasons)
    assert target.calls == [] and not (folder / "manifest.yaml").exists()


def test_candidate_that_never_serves_is_rolled_back(server, overlay, tmp_path):
    target = RecordingTarget(endpoint(server), ready_error=TargetError("pd-llm-blue not RUNNING after 5s"))
    out, _ = run(overlay, target, tmp_path)
    assert out.verdict == "failed" and "not RUNNING" in out.reasons[0]
    assert target.calls == ["apply", "wait_ready", "rollback"]


def test_release_settles_what_an_earlier_run_left_by_the_rollout_steps_rule(server, overlay, tmp_path, monkeypatch):
    """steps.settle_candidate, shared with the Argo rollout step (tests/unit/test_kube_idempotent.py runs
    that path on the test cluster): another release's pending candidate is rolled back before the
    rollout; the render that already serves as stable is unchanged, with nothing applied."""
    from workflows.targets.base import ReleaseRecord

    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)   # as in the promote test above
    target = RecordingTarget(endpoint(server), ready_error=TargetError("stop after the rollout"))
    target.candidate = ReleaseRecord.of("kind: X\n", name="pd-llm", model="pdops-tiny", revision="b" * 40)
    out, _ = run(overlay, target, tmp_path / "1")   # run folders are named by the second: one root each
    assert target.calls[:3] == ["rollback", "apply", "wait_ready"], target.calls

    target = RecordingTarget(endpoint(server))
    first, _ = run(overlay, target, tmp_path / "2")
    assert first.verdict == "promote", first.reasons
    target.calls.clear()
    again, _ = run(overlay, target, tmp_path / "3")
    assert (again.verdict, target.calls) == ("unchanged", [])


def test_interrupted_validation_still_rolls_back(server, overlay, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(steps, "validate_candidate", interrupted)
    target = RecordingTarget(endpoint(server))
    with pytest.raises(KeyboardInterrupt):
        run(overlay, target, tmp_path)
    assert target.calls == ["apply", "wait_ready", "rollback"]


def test_unwritable_run_folder_is_bad_input(tmp_path):
    (tmp_path / "runs").write_text("a file where the folder should be")
    with pytest.raises(InputError, match="cannot write the run folder"):
        steps.new_run_dir(tmp_path / "runs", "local")


# -- faults injected between validation and the candidate (tests/fakes/fault_proxy.py) ----------------

def test_candidate_answering_5xx_rolls_back_and_the_report_counts_the_errors(server, overlay, tmp_path):
    with FaultProxy(server.base_url, fail_every=3) as proxy:
        target = RecordingTarget(Endpoint(base_url=proxy.base_url))
        out, folder = run(overlay, target, tmp_path)
    assert proxy.injected["5xx"] > 0
    assert out.verdict == "rollback" and target.calls == ["apply", "wait_ready", "rollback"]
    bench = json.loads(next(folder.glob("bench-0-*.json")).read_text())
    assert bench["errors"] > 0 and any("error rate" in r for r in out.reasons)
    assert json.loads((folder / "release.json").read_text())["verdict"] == "rollback"


def test_candidate_hanging_mid_stream_is_cut_off_by_the_request_timeout(server, overlay, tmp_path):
    edit(overlay, validation__request_timeout_s=2)
    with FaultProxy(server.base_url, hang_every=2, hang_after_events=2) as proxy:
        target = RecordingTarget(Endpoint(base_url=proxy.base_url))
        out, folder = run(overlay, target, tmp_path)
    assert proxy.injected["hang"] > 0
    assert out.verdict == "rollback" and target.calls == ["apply", "wait_ready", "rollback"]
    bench = json.loads(next(folder.glob("bench-0-*.json")).read_text())
    assert bench["errors"] > 0


def test_run_folder_filling_up_during_validation_rolls_back_and_reports(server, overlay, tmp_path, monkeypatch):
    """Emulated: every write under the run folder fails with ENOSPC once the candidate is applied
    (tests/e2e fills a real tmpfs instead)."""
    write_text = Path.write_text
    target = RecordingTarget(endpoint(server))

    def full_after_apply(self, *args, **kwargs):
        if "apply" in target.calls and "runs" in self.parts:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_after_apply)
    out, folder = run(overlay, target, tmp_path)
    assert out.verdict == "failed" and target.calls == ["apply", "wait_ready", "rollback"]
    assert out.reasons == [f"validation could not record its results: cannot write {folder / 'compat.json'}: "
                              "No space left on device"]
    assert not (folder / "release.json").exists() and (folder / "manifest.yaml").exists()


def test_an_engine_replaced_during_validation_rolls_back_the_candidate(server, overlay, tmp_path, monkeypatch):
    """Measured on the real stack: Serve restarted a killed prefill engine and the candidate then
    passed every check; what the target reports about its replicas must stop it."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    started = endpoint(server).model_copy(update={"metrics_phases": {"prefill": {"ReplicaId": ["p1"]},
                                                                      "decode": {"ReplicaId": ["d1"]}}})
    target = RecordingTarget(started)
    replaced = started.model_copy(update={"metrics_phases": {"prefill": {"ReplicaId": ["p2"]},
                                                             "decode": {"ReplicaId": ["d1"]}}})
    reads = iter([started])   # validation starts on p1; every later read sees p2 (Serve replaced it)
    monkeypatch.setattr(target, "endpoint", lambda slot: next(reads, replaced))
    out, _ = run(overlay, target, tmp_path)
    assert out.verdict == "rollback" and target.calls == ["apply", "wait_ready", "rollback"]
    assert out.reasons == ["engines replaced during validation: prefill p1 replaced by p2"]


# -- validate_slot: the stage `pdops validate` (the Argo step and the canary) runs -----------------

def test_a_promoted_release_records_its_baseline_and_the_next_candidate_is_compared_with_it(
        server, overlay, tmp_path, monkeypatch):
    """vs_stable on the Argo path: the report files of the promoting run are gone (they were in a
    pod), so the baseline must travel in the target's history record."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    target = RecordingTarget(endpoint(server))
    out, _ = run(overlay, target, tmp_path)
    assert out.verdict == "promote" and target.baseline and target.baseline[0]["ttft_ms"]["p90"] > 0
    stable = target.stable.model_copy(update={"baseline": target.baseline, "report": "/gone", "verdict": "promote"})
    target.stable = stable
    # a candidate the stable baseline says is 1000x faster than it can be: only vs_stable can fail it
    # (its per-request samples too: with samples, vs_stable compares distributions, not p90s)
    faster = [dict(b, ttft_ms={**b["ttft_ms"], "p90": b["ttft_ms"]["p90"] / 1000},
                   samples={**b["samples"], "ttft": [v / 1000 for v in b["samples"]["ttft"]]}) for b in target.baseline]
    target.status = lambda: TargetStatus(  # type: ignore[method-assign]
        target="recording", stable=SlotStatus(slot="stable", release=stable, state="ready"),
        candidate=SlotStatus(slot="candidate", release=target.candidate),
        last_good=stable.model_copy(update={"baseline": faster}))
    # recorded: the baseline even though stable serves (measure: live is tests/unit/test_interleave.py)
    edit(overlay, slo__vs_stable={"ttft_p90": 1.1, "measure": "recorded"})
    rendered = steps.load_release(str(overlay), None)
    target.candidate = steps.record_of(rendered, "next").model_copy(update={"colour": "green"})
    (tmp_path / "v").mkdir()
    result = steps.validate_slot(target, rendered.spec, tmp_path / "v", lambda m: None, digest=target.candidate.digest)
    failed = [c for c in result.decision.checks if not c.ok]
    assert [c.check for c in failed] == ["vs_stable_ttft_p90"], failed


def test_validate_refuses_a_slot_holding_another_release(server, overlay, tmp_path):
    target = RecordingTarget(endpoint(server))
    rendered = steps.load_release(str(overlay), None)
    target.candidate = steps.record_of(rendered, "x").model_copy(update={"digest": "sha256:" + "0" * 64})
    with pytest.raises(TargetError, match="not the release the overlay renders"):
        steps.validate_slot(target, rendered.spec, tmp_path, lambda m: None, digest=steps.record_of(rendered, "").digest)
    target.candidate = None
    with pytest.raises(TargetError, match="no candidate release to validate"):
        steps.validate_slot(target, rendered.spec, tmp_path, lambda m: None)
    target.stable = steps.record_of(rendered, "x").model_copy(update={"model": "another-model"})
    with pytest.raises(TargetError, match="serves model another-model"):
        steps.validate_slot(target, rendered.spec, tmp_path, lambda m: None, slot="stable")



@pytest.mark.parametrize("void_runs, remeasure, verdict", [(1, 1, "promote"), (2, 1, "rollback"), (1, 0, "rollback")])
def test_a_void_load_is_measured_again_before_the_gate_fails_it_closed(server, overlay, tmp_path, monkeypatch,
                                                                        void_runs, remeasure, verdict):
    """slo.remeasure_void: a load whose client was starved (a void measurement, the tool's error) runs again,
    at most `remeasure` times; the gate judges the last run, so a void that persists still rolls back, and the
    earlier void runs stay in the run folder and are named in the decision."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)   # only the injected stall voids a run
    runs = starve(monkeypatch, tmp_path, range(1, void_runs + 1))
    edit(overlay, slo__client_health="required", slo__remeasure_void=remeasure)
    out, folder = run(overlay, RecordingTarget(endpoint(server)), tmp_path)
    assert out.verdict == verdict, out.reasons
    measured = min(void_runs, remeasure) + 1 if verdict == "promote" else remeasure + 1
    assert len(runs.read_text().splitlines()) == measured
    kept = json.loads((folder / "bench-0-balanced.json").read_text())
    assert len(kept["void_attempts"]) == measured - 1 and all("lag" in r for r in kept["void_attempts"])
    assert sorted(p.name for p in folder.glob("bench-0-balanced.void-*.json")) == [
        f"bench-0-balanced.void-{k}.json" for k in range(1, measured)]
    check = next(c for c in json.loads((folder / "report.json").read_text())["decision"]["checks"]
                 if c["check"] == "client_bottleneck")
    assert check["ok"] == (verdict == "promote"), check
    if verdict == "promote":
        assert "measured again after 1 void run(s)" in check["message"], check
    elif remeasure:
        assert f"every one of its {measured} runs void" in check["message"], check
    else:
        assert "runs void" not in check["message"] and "measurement void" in check["message"], check


def test_a_starved_client_is_not_measured_again_where_client_health_is_ignored(server, overlay, tmp_path,
                                                                                monkeypatch):
    """overlays/local (slo.client_health: ignored) reports a starved client and judges the run anyway: no
    second run of the load."""
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    runs = starve(monkeypatch, tmp_path, {1})
    out, folder = run(overlay, RecordingTarget(endpoint(server)), tmp_path)
    assert out.verdict == "promote", out.reasons
    assert len(runs.read_text().splitlines()) == 1
    assert json.loads((folder / "bench-0-balanced.json").read_text())["void_attempts"] == []
