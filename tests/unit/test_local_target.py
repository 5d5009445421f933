"""The local target's slot, history and crash logic, on a stand-in for the Ray process.

`FakeRay` replaces only the process and REST layer (LocalRay): it keeps the declared Serve
applications and moves their status the way Serve does. Everything else is the real LocalTarget
writing real state files. The real Ray path is exercised by tests/e2e (marked e2e).
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT
from workflows.targets.base import ReleaseRecord, TargetError, last_good
from workflows.targets.local import LocalTarget, _serve_error, worker_resources
from workflows.targets.local_stack import Ports


class FakeRay:
    """Declared applications by name; each reaches `outcome` (RUNNING by default) on its next read."""

    def __init__(self) -> None:
        self.apps: dict[str, dict] = {}
        self.running = False
        self.fail: dict[str, str] = {}      # app name -> status it ends in instead of RUNNING
        self.deploys = 0
        self.deleting_reads = 0             # reads a left-out application stays DELETING, as in Serve
        self.log = Path("/dev/null")
        self.temp_dir = Path("/nonexistent/pdops-ray")
        self.metrics_url = "http://127.0.0.1:9/metrics"

    def pid(self):
        return 4242 if self.running else None

    def metrics_lag_s(self):
        return 10.0

    def start(self, resources, progress):
        self.running = True

    def resources(self):
        return {"prefill_node": 2.0, "decode_node": 2.0}

    def stop(self, progress):
        was, self.running, self.apps = self.running, False, {}
        return was

    def deploy(self, applications):
        self.deploys += 1
        new = {}
        for app in applications:
            old = self.apps.get(app["name"])
            same = old is not None and old["config"]["args"] == app["args"]
            new[app["name"]] = {"config": app, "route_prefix": app["route_prefix"],
                                "status": old["status"] if same else "DEPLOYING",
                                "deployments": {"Decode:m": {"status": "HEALTHY", "replicas": [
                                    {"replica_id": app["name"] + "-decode"}]}}}
        for name, app in self.apps.items():
            if name not in new and self.deleting_reads:
                new[name] = {**app, "status": "DELETING", "reads_left": self.deleting_reads}
        self.apps = new

    def applications(self):
        for name, app in list(self.apps.items()):
            if app["status"] == "DELETING":
                app["reads_left"] -= 1
                if app["reads_left"] < 0:
                    del self.apps[name]
                continue
            if app["status"] == "DEPLOYING":
                app["status"] = self.fail.get(name, "RUNNING")
                if name in self.fail:
                    app["message"] = f"{name} failed on purpose"
        return self.apps


def record(n: int = 1) -> ReleaseRecord:
    manifest = (ROOT / "tests" / "golden" / "local.yaml").read_text() + f"# variant {n}\n"
    return ReleaseRecord.of(manifest, "pd-llm", "pdops-tiny", f"rev{n}")


@pytest.fixture
def target(tmp_path, monkeypatch):
    # slot_application resolves tiny-model:// sources; the model itself is not needed here.
    monkeypatch.setattr("workflows.targets.local.resolve_source", lambda s: "/models/tiny")
    return LocalTarget(home=tmp_path, ports=Ports.from_base(18000), stack=FakeRay(), poll_s=0.01)


def say(_msg: str) -> None:
    pass


def promoted(target: LocalTarget, n: int) -> ReleaseRecord:
    target.apply(record(n), say)
    target.wait_ready(5, say)
    return target.promote([f"release {n} passed"], f"runs/{n}", say)


def test_worker_resources_are_read_from_the_rendered_rayservice():
    manifest = (ROOT / "tests" / "golden" / "local.yaml").read_text()
    assert worker_resources(manifest) == {"prefill_node": 1, "decode_node": 1}


def test_first_release_is_a_blue_candidate_then_takes_the_stable_route(target):
    cand = target.apply(record(1), say)
    assert cand.colour == "blue"
    assert target.ray.apps["pd-llm-blue"]["route_prefix"] == "/candidate"
    endpoint = target.wait_ready(5, say)
    assert endpoint.base_url == "http://127.0.0.1:18000/candidate/v1"
    assert endpoint.metrics_labels == {"ReplicaId": ["pd-llm-blue-decode"]}
    assert endpoint.metrics_phases == {"decode": {"ReplicaId": ["pd-llm-blue-decode"]}}
    target.promote(["ok"], "runs/1", say)
    assert target.ray.apps["pd-llm-blue"]["route_prefix"] == "/"
    assert target.ray.apps["pd-llm-blue"]["status"] == "RUNNING"  # promotion did not redeploy the engines
    st = target.status()
    assert st.stable.release.digest == record(1).digest and st.candidate.release is None
    assert st.last_good.digest == record(1).digest and st.last_good.report == "runs/1"


def test_second_candidate_runs_beside_stable_on_other_colour_and_nixl_ports(target):
    promoted(target, 1)
    cand = target.apply(record(2), say)
    assert cand.colour == "green"
    apps = target.ray.apps
    assert apps["pd-llm-blue"]["route_prefix"] == "/" and apps["pd-llm-green"]["route_prefix"] == "/candidate"
    ports = {name: {phase: app["config"]["args"][phase]["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"]
                    for phase in ("prefill_config", "decode_config")} for name, app in apps.items()}
    assert len({p for colour in ports.values() for p in colour.values()}) == 4, ports


def test_rollback_drops_the_candidate_and_keeps_stable(target):
    promoted(target, 1)
    target.apply(record(2), say)
    message = target.rollback(["ttft p90 too high"], "runs/2", say)
    assert "dropped candidate" in message
    assert set(target.ray.apps) == {"pd-llm-blue"} and target.ray.apps["pd-llm-blue"]["route_prefix"] == "/"
    verdicts = [(r.revision, r.verdict) for r in target.history()]
    assert verdicts == [("rev1", "promote"), ("rev2", "rollback")]
    assert target.history()[-1].reasons == ["ttft p90 too high"]
    assert last_good(target.history()).revision == "rev1"


def test_apply_is_idempotent_for_the_same_digest_and_refuses_another(target):
    first = target.apply(record(1), say)
    again = target.apply(record(1), say)
    assert again.colour == first.colour and again.applied_at == first.applied_at
    with pytest.raises(TargetError, match="different candidate is pending"):
        target.apply(record(2), say)


def test_a_crash_after_apply_leaves_a_pending_candidate_the_next_process_undoes(target, tmp_path):
    class Crash(Exception):
        pass

    promoted(target, 1)

    def crash(apps):
        raise Crash()

    target.ray.deploy = crash
    with pytest.raises(Crash):
        target.apply(record(2), say)
    state = json.loads((tmp_path / "local" / "state.json").read_text())
    assert state["candidate"]["revision"] == "rev2"   # written before Serve was touched
    fresh = LocalTarget(home=tmp_path, ports=Ports.from_base(18000), stack=FakeRay(), poll_s=0.01)
    assert fresh.status().candidate.release.revision == "rev2"
    fresh.rollback(["left half way"], None, say)
    assert fresh.status().candidate.release is None
    assert set(fresh.ray.apps) == {"pd-llm-blue"}    # the new process redeclared stable from disk


def test_failed_deploy_raises_with_serve_messages(target):
    target.ray.fail["pd-llm-blue"] = "DEPLOY_FAILED"
    target.apply(record(1), say)
    with pytest.raises(TargetError, match="DEPLOY_FAILED") as err:
        target.wait_ready(5, say)
    assert any("failed on purpose" in d for d in err.value.details)


def test_never_ready_times_out(target):
    target.ray.fail["pd-llm-blue"] = "DEPLOYING"
    target.apply(record(1), say)
    with pytest.raises(TargetError, match="not RUNNING after"):
        target.wait_ready(0.05, say)


def test_rollback_restores_stable_lost_with_ray(target):
    promoted(target, 1)
    target.ray.stop(say)                        # Ray gone: nothing serves
    assert target.status().stable.state == "absent"
    message = target.rollback(["restore"], None, say)
    blue = target.ray.apps["pd-llm-blue"]
    assert blue["route_prefix"] == "/" and blue["status"] == "RUNNING"
    assert "stable serving again" in message


def test_rollback_to_previous_restores_the_good_release_before(target):
    promoted(target, 1)
    promoted(target, 2)
    assert target.status().stable.release.revision == "rev2"
    target.rollback(["canary: ttft regressed"], None, say, to_previous=True)
    st = target.status()
    assert st.stable.release.revision == "rev1" and st.last_good.revision == "rev1"
    assert [r.verdict for r in target.history()] == ["promote", "regressed"]


def test_second_session_is_refused_while_one_runs(target, tmp_path):
    other = LocalTarget(home=tmp_path, ports=Ports.from_base(18000), stack=FakeRay())
    with target.session():
        with pytest.raises(TargetError, match="another release is running"):
            with other.session():
                pass
    with other.session():       # released again afterwards
        pass


def test_full_disk_under_pdops_home_keeps_the_last_good_release(target, monkeypatch):
    """Emulated: fsync of the state files fails with ENOSPC, as on a full filesystem."""
    promoted(target, 1)
    target.apply(record(2), say)
    before = {f.name: f.read_bytes() for f in target.home.glob("*.json")}

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("workflows.targets.local.os.fsync", full)
    with pytest.raises(TargetError, match="cannot write the local target's state .*No space left on device"):
        target.rollback(["ttft p90 too high"], "runs/2", say)
    assert {f.name: f.read_bytes() for f in target.home.glob("*.json")} == before
    assert not list(target.home.glob("*.tmp"))
    monkeypatch.undo()
    monkeypatch.setattr("workflows.targets.local.resolve_source", lambda s: "/models/tiny")
    assert "dropped candidate" in target.rollback(["disk freed"], None, say)   # the next run undoes it
    assert last_good(target.history()).revision == "rev1"


def test_a_failed_replica_is_reported_with_the_root_cause_from_its_worker_log(tmp_path):
    """Serve's message ends in "see root cause above"; the cause is only in the worker's own log
    (text below as Ray 2.60 wrote it for a decode engine whose UCX could not reach itself)."""
    (tmp_path / "worker-b95-01000000-16039.err").write_text(
        '{"levelname": "INFO", "message": "no error here"}\n'
        "W1203 07:53:37.653570   16180 ucx_enums.cpp:58] Unexpected UCX error: Destination is unreachable\n"
        "    raise RuntimeError(\n"
        "RuntimeError: Worker failed with error 'NIXL_ERR_BACKEND', please check the stack trace above\n")
    message = ("The deployment failed to start 3 times in a row. This may be due to a problem with its "
               "constructor. Error:\n\x1b[36mray::ServeReplica:pd-llm-blue:Decode.initialize_and_get_metadata()"
               "\x1b[39m (pid=16039, ip=127.0.0.1)\n    raise RuntimeError(traceback.format_exc()) from None\n"
               "RuntimeError: Engine core initialization failed. See root cause above.\n")
    summary = _serve_error(message, tmp_path)
    assert summary.startswith("The deployment failed to start 3 times in a row. Raised: RuntimeError: Engine core")
    assert "Destination is unreachable" in summary and "NIXL_ERR_BACKEND" in summary
    assert "no error here" not in summary and "\x1b" not in summary and "raise RuntimeError(" not in summary
    assert _serve_error(message, tmp_path / "elsewhere").endswith("See root cause above.")


def test_rollback_returns_once_serve_has_removed_the_candidate(target):
    """Serve deletes a left-out application in the background (seen: still listed, DELETING, right
    after the config PUT); the candidate's engines must be gone before the next release starts."""
    promoted(target, 1)
    target.apply(record(2), say)
    target.wait_ready(5, say)
    target.ray.deleting_reads = 3
    lines: list[str] = []
    target.rollback(["ttft p90 too high"], None, lines.append)
    assert set(target.ray.apps) == {"pd-llm-blue"}
    assert "[ray] waiting for Serve to remove pd-llm-green" in lines


def test_the_baseline_is_the_stable_slots_engines_checked_for_foreign_requests(target):
    """The local target reuses the stable slot (no third slot fits in memory); it is a fair baseline
    only while nobody else sends it requests, which each block checks (validation.interleave.foreign_requests)."""
    from validation.interleave import foreign_requests
    from validation.reports import BenchReport
    from workflows.targets.base import Baseline, Skipped

    stable = promoted(target, 1)
    target.apply(record(2), say)
    with target.baseline_server(stable, say) as got:
        assert isinstance(got, Baseline) and got.void_reason is foreign_requests
        assert got.endpoint.base_url == "http://127.0.0.1:18000/v1" and got.release == stable.short()
        assert got.endpoint.metrics_labels == {"ReplicaId": ["pd-llm-blue-decode"]}   # stable's engines only
        ours = BenchReport.model_validate({"requests_total": 4, "server": {"requests_seen": 4}})
        theirs = BenchReport.model_validate({"requests_total": 4, "server": {"requests_seen": 6}})
        assert got.void_reason(ours) is None and "2 were not ours" in got.void_reason(theirs)
    assert target.ray.apps["pd-llm-blue"]["status"] == "RUNNING"    # nothing started, nothing removed
    with target.baseline_server(record(3), say) as other:           # stable holds another release
        assert isinstance(other, Skipped) and "no baseline engines to reuse" in other.reason
    target.ray.stop(say)
    with target.baseline_server(stable, say) as down:
        assert isinstance(down, Skipped) and "is not serving" in down.reason



def test_the_local_rays_metrics_lag_follows_the_export_interval_it_was_started_with(tmp_path):
    """Ray exports metrics every metrics_report_interval_ms (RAY_<name> in every Ray process; floor
    1 s). A Ray that pdops started records the interval; one started by an older pdops has none and
    is taken at Ray's 10 s default, so no window opens before its figures are exported."""
    from workflows.targets.local_stack import ENGINE_ENV, METRICS_INTERVAL_MS, LocalRay

    ray = LocalRay(tmp_path, Ports.from_base(18000))
    assert ray.metrics_lag_s() == 10.0
    assert ENGINE_ENV["RAY_metrics_report_interval_ms"] == str(METRICS_INTERVAL_MS)
    ray.interval_file.write_text(str(METRICS_INTERVAL_MS))
    assert ray.metrics_lag_s() == METRICS_INTERVAL_MS / 1000 * 1.25
    ray.interval_file.write_text("500")
    assert ray.metrics_lag_s() == 1.25    # Ray's floor: never faster than 1 s


def _canary_decision(p90_ms: float, *, kv_ok: bool = True):
    from validation.reports.decision import Check, Decision

    return Decision.of([Check(check="ttft_p90_ms", ok=True, bench="c8", value=p90_ms, limit=900.0, message="t"),
                        Check(check="kv_transfer", ok=kv_ok, bench="c8", value=0 if not kv_ok else 100,
                              message="c8: 0 prompt tokens arrived by KV transfer" if not kv_ok else "kv")], 1, set())


def test_the_canary_history_sits_beside_the_release_state_and_resets_on_a_new_release(target, tmp_path,
                                                                                           monkeypatch):
    """The path of `pdops validate --slot stable` (workflows/pipeline/canary.py) on the local target: each run
    recorded once under its run id (PDOPS_RUN_ID; a retry of the same id records nothing), a promote of
    another release starts the history again, a hard failure acts on the first run."""
    from workflows.pipeline.canary import judge_canary

    promoted(target, 1)
    for i in range(3):
        monkeypatch.setenv("PDOPS_RUN_ID", f"uid-{i}")
        v = judge_canary(target, _canary_decision(300.0 + i), tmp_path / f"run{i}", say)
        assert not v.act
    monkeypatch.setenv("PDOPS_RUN_ID", "uid-2")          # the retried step
    judge_canary(target, _canary_decision(999.0), tmp_path / "run2", say)
    saved = json.loads((target.home / "canary.json").read_text())
    assert saved["release"] == record(1).digest and saved["runs_since_reset"] == 3
    assert [r["run"] for r in saved["recent"]] == ["uid-0", "uid-1", "uid-2"]
    promoted(target, 2)
    monkeypatch.setenv("PDOPS_RUN_ID", "uid-3")
    v = judge_canary(target, _canary_decision(300.0, kv_ok=False), tmp_path / "run3", say)
    saved = json.loads((target.home / "canary.json").read_text())
    assert saved["release"] == record(2).digest and saved["runs_since_reset"] == 1
    assert v.act and v.hard == ["c8: 0 prompt tokens arrived by KV transfer"]


def test_pdops_validate_stable_turns_one_looks_latency_failure_into_no_action(target, tmp_path, monkeypatch):
    """cmd_validate's stable branch (workflows/cli/validate.py _across_runs): the gate's per-run rollback on
    a latency figure becomes promote (stays) with the CUSUM lines in the reasons and summary.md; a hard
    failure stays rollback."""
    from validation.reports.decision import Check, Decision
    from workflows.cli.validate import _across_runs

    promoted(target, 1)
    monkeypatch.setenv("PDOPS_RUN_ID", "pd-canary-1")
    (tmp_path / "summary.md").write_text("# gate\n")
    slow = Decision.of([Check(check="ttft_p90_ms", ok=False, bench="c8", value=950.0, limit=900.0,
                              message="c8: ttft p90 950 ms > 900 ms")], 1, set())
    assert slow.verdict == "rollback"
    d = _across_runs(target, slow, tmp_path, say)
    assert d.verdict == "promote" and any("runs since the serving release" in r for r in d.reasons)
    assert "## Canary across runs" in (tmp_path / "summary.md").read_text()
    monkeypatch.setenv("PDOPS_RUN_ID", "pd-canary-2")
    d = _across_runs(target, _canary_decision(300.0, kv_ok=False), tmp_path, say)
    assert d.verdict == "rollback" and d.reasons[0] == "c8: 0 prompt tokens arrived by KV transfer"
