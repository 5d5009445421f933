"""The engine's Argo semantics on small hand-written templates whose steps are real `sh` processes.

Each test names the upstream function (argoproj/argo-workflows v4.0.10) whose behaviour it pins.
"""
from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from tests.argo.exprs import ExprError, NotEmulated, eval_depends, eval_expr, eval_when
from tests.argo.spec import WorkflowSpec
from tests.argo.validate import Rejected
from tests.argo.workflow import run_workflow

HEAD = """
entrypoint: main
volumes: [{name: tmp, emptyDir: {}}]
arguments:
  parameters:
  - {name: mode, value: a, enum: [a, b]}
templates:
"""


def step(name: str, script: str, extra: str = "") -> str:
    return f"""
- name: {name}
  container:
    image: busybox
    command: [sh, -c]
    args: [{script!r}]
    volumeMounts: [{{name: tmp, mountPath: /tmp}}]
{extra}"""


def spec(*parts: str, dag: str = "", head: str = HEAD) -> WorkflowSpec:
    text = head + "".join(parts) + (f"\n- name: main\n  dag:\n    tasks:\n{dag}" if dag else "")
    return WorkflowSpec.model_validate(yaml.safe_load(text))


@pytest.fixture
def run(runner, argo_root):
    def go(s: WorkflowSpec, **kw):
        return run_workflow(s, runner(), work=argo_root / "wf", **kw)
    return go


# ---- expressions (pure) ------------------------------------------------------------------------------

def test_when_is_govaluate_with_bare_words_as_strings():
    """steps.go shouldExecute: VARIABLE tokens become strings; true/false are booleans."""
    assert eval_when("Failed != Succeeded") and not eval_when("Succeeded != Succeeded")
    assert eval_when("false == false") and not eval_when("true == false")
    assert eval_when("'rollback' != 'promote' && rollback == rollback")
    assert not eval_when("'x' != 'promote' && alert == rollback")
    assert eval_when("(a == b) || !(c == d)")
    with pytest.raises(ExprError):      # "false" the string is not the boolean false
        eval_when("'false' == false") or eval_when("1")
    with pytest.raises(ExprError):      # an accessor (word with '.') cannot be evaluated
        eval_when("tasks.gate == promote")
    with pytest.raises(NotEmulated):    # a date string is a govaluate TIME token
        eval_when("'2026-12-03' == '2026-12-03'")
    with pytest.raises(NotEmulated):    # arithmetic: not used, not emulated
        eval_when("long-prompt == x")


def test_depends_is_expr_over_task_results():
    """dag.go evaluateDependsLogic: TaskResults per dependency, '-' -> '_'."""
    phases = {"gate": "Failed", "build-config": "Succeeded"}
    assert eval_depends("gate.Succeeded || gate.Failed", phases)
    assert not eval_depends("gate.Succeeded", phases)
    assert eval_depends("build-config.Succeeded && !gate.Skipped", phases)
    assert eval_depends("gate.Omitted || build-config.Succeeded", {"gate": "Omitted", "build-config": "Failed"})


def test_retry_expression_sees_strings():
    """buildRetryStrategyLocalScope: exitCode is a string; asInt() converts (util/expr/env)."""
    env = {"lastRetry": {"exitCode": "75", "status": "Failed"}, "retries": "0"}
    assert eval_expr("asInt(lastRetry.exitCode) == 75", env) is True
    assert eval_expr("lastRetry.exitCode == 75", env) is False
    assert eval_expr("lastRetry.exitCode in ['75', '76']", env) is True
    with pytest.raises(NotEmulated):
        eval_expr("sprig.trim(lastRetry.message) == ''", env)


# ---- DAG, when, depends, outputs --------------------------------------------------------------------------

def test_outputs_parameters_artifacts_and_globals_flow_through_the_dag(run):
    """valueFrom.path (trailing newline trimmed, executor SaveParameters), default when the file is
    missing, artifacts passed by `from`, globalName -> workflow.outputs.parameters."""
    s = spec(step("make", "echo hello > /tmp/p; mkdir -p /tmp/d; echo x > /tmp/d/f", """  outputs:
    parameters:
    - {name: p, valueFrom: {path: /tmp/p}, globalName: gp}
    - {name: q, valueFrom: {path: /tmp/missing, default: dflt}}
    artifacts: [{name: d, path: /tmp/d}]"""),
             step("use", 'test "$P" = hello-dflt-a && cat /tmp/in/d/f > /tmp/out', """  inputs:
    parameters: [{name: p}]
    artifacts: [{name: d, path: /tmp/in/d}]
  outputs:
    parameters: [{name: got, valueFrom: {path: /tmp/out}}]"""),
             dag="""
    - {name: make, template: make}
    - name: use
      template: use
      depends: make.Succeeded
      arguments:
        parameters: [{name: p, value: '{{tasks.make.outputs.parameters.p}}-{{tasks.make.outputs.parameters.q}}-{{workflow.parameters.mode}}'}]
        artifacts: [{name: d, from: '{{tasks.make.outputs.artifacts.d}}'}]
""")
    data = s.model_dump(by_alias=True, exclude_none=True)
    data["templates"][1]["container"]["env"] = [{"name": "P", "value": "{{inputs.parameters.p}}"}]
    r = run(WorkflowSpec.model_validate(data))
    assert r.phase == "Succeeded", r.describe()
    assert r.task("use").params == {"got": "x"}
    assert r.outputs == {"gp": "hello"}


def test_when_false_skips_and_dependents_are_omitted_but_the_dag_succeeds(run):
    """A Skipped task (when false) satisfies only `.Skipped`; `.Succeeded` dependents are Omitted;
    assessDAGPhase: omitted leaves inherit the branch phase (Succeeded here)."""
    s = spec(step("a", "true"), step("b", "true"), dag="""
    - {name: a, template: a, when: '{{workflow.parameters.mode}} == b'}
    - {name: b, template: b, depends: a.Succeeded}
    - {name: c, template: b, depends: a.Skipped}
""")
    r = run(s)
    assert r.phases() == {"a": "Skipped", "b": "Omitted", "c": "Succeeded"}
    assert r.task("a").message == "when 'a == b' evaluated false"
    assert r.phase == "Succeeded"


def test_a_failed_branch_fails_the_dag_even_when_its_leaf_is_omitted(run):
    s = spec(step("bad", "exit 3"), step("ok", "true"), dag="""
    - {name: bad, template: bad}
    - {name: after, template: ok, depends: bad.Succeeded}
    - {name: cleanup, template: ok, depends: bad.Failed}
""")
    r = run(s)
    assert r.phases() == {"bad": "Failed", "after": "Omitted", "cleanup": "Succeeded"}
    assert r.task("bad").message == "main: Error (exit code 3)" and r.task("bad").exit_code == "3"
    assert r.phase == "Failed"


def test_when_referencing_a_non_ancestor_is_rejected_at_submit(run):
    """validate.go validateDAGTaskArgumentDependency: a `{{tasks.X...}}` argument of a non-ancestor."""
    s = spec(step("a", "true", "  outputs:\n    parameters: [{name: v, valueFrom: {path: /tmp/v, default: x}}]"),
             step("b", "true", "  inputs:\n    parameters: [{name: v}]"), dag="""
    - {name: a, template: a}
    - name: b
      template: b
      arguments: {parameters: [{name: v, value: '{{tasks.a.outputs.parameters.v}}'}]}
""")
    with pytest.raises(Rejected, match="missing dependency 'a'"):
        run(s)


# ---- retries ----------------------------------------------------------------------------------------

RETRY = """  retryStrategy:
    limit: 3
    retryPolicy: {policy}
    {expression}
    backoff: {{duration: 15s, factor: 2, maxDuration: 5m}}"""


def test_retry_only_on_the_exit_code_the_expression_names(run):
    """processNodeRetries: policy, then limit, then `expression` with lastRetry.exitCode (a string)."""
    s = spec(step("flaky", "exit 75", RETRY.format(policy="Always", expression="expression: asInt(lastRetry.exitCode) == 75")),
             step("verdict", "exit 1", RETRY.format(policy="Always", expression="expression: asInt(lastRetry.exitCode) == 75")),
             dag="""
    - {name: flaky, template: flaky}
    - {name: verdict, template: verdict}
""")
    r = run(s)
    flaky, verdict = r.task("flaky"), r.task("verdict")
    assert [a.exit_code for a in flaky.attempts] == ["75"] * 4 and flaky.message == "No more retries left"
    assert [a.exit_code for a in verdict.attempts] == ["1"]
    assert verdict.message == "retryStrategy.expression evaluated to false"
    # backoff 15s * 2^n, skipped not slept: 15, 30, 60 for flaky's three retries; verdict too waits
    # 15 s before its expression is read (processNodeRetries checks backoff before the expression)
    assert sorted(round(w) for w in r.backoff_waits) == [15, 15, 30, 60]


def test_on_error_policy_does_not_retry_a_failed_step(run):
    s = spec(step("f", "exit 2", RETRY.format(policy="OnError", expression="")), dag="    - {name: f, template: f}\n")
    r = run(s)
    assert len(r.task("f").attempts) == 1 and r.task("f").phase == "Failed"


def test_backoff_beyond_max_duration_stops_retrying(run):
    """processNodeRetries: `waitingDeadline > maxDurationDeadline` -> "Backoff would exceed max duration limit"."""
    s = spec(step("f", "exit 1", """  retryStrategy:
    limit: 5
    retryPolicy: Always
    backoff: {duration: 40s, factor: 2, maxDuration: 1m}"""), dag="    - {name: f, template: f}\n")
    r = run(s)
    # attempt 0 fails at ~0 s, the retry starts after 40 s; the next would start at 40 + 80 s > 60 s
    assert len(r.task("f").attempts) == 2
    assert r.task("f").message == "Backoff would exceed max duration limit"


def test_active_deadline_kills_the_step(run):
    s = spec(step("slow", "sleep 30", "  activeDeadlineSeconds: 1"), dag="    - {name: slow, template: slow}\n")
    r = run(s)
    node = r.task("slow")
    assert node.phase == "Failed" and "longer than the specified deadline" in node.message
    assert node.finished - node.started < 10


# ---- workflow level ----------------------------------------------------------------------------------

def test_exit_handler_sees_the_failed_status_and_metrics_are_computed_after_it(run):
    base = spec(step("bad", "echo 7 > /tmp/v; exit 1", """  outputs:
    parameters: [{name: v, valueFrom: {path: /tmp/v}, globalName: v}]"""),
                step("report", 'test "$S" = Failed'),
                dag="    - {name: bad, template: bad}\n")
    data = base.model_dump(by_alias=True, exclude_none=True)
    data["templates"][1]["container"]["env"] = [{"name": "S", "value": "{{workflow.status}}"}]
    data["onExit"] = "exit"
    data["templates"].append({"name": "exit", "dag": {"tasks": [
        {"name": "report", "template": "report", "when": "{{workflow.status}} != Succeeded"}]}})
    data["metrics"] = {"prometheus": [
        {"name": "wf_value", "help": "h", "labels": [{"key": "status", "value": "{{workflow.status}}"}],
         "gauge": {"value": "{{workflow.outputs.parameters.v}}"}},
        {"name": "wf_missing", "help": "h", "counter": {"value": "{{workflow.outputs.parameters.nope}}"}}]}
    r = run(WorkflowSpec.model_validate(data))
    assert r.phase == "Failed"
    assert r.task("report", on_exit=True).phase == "Succeeded", r.describe()
    assert [(m.name, m.labels, m.value) for m in r.metrics] == [("wf_value", {"status": "Failed"}, 7.0)]
    assert r.metric_errors == ["wf_missing: failed to resolve {{workflow.outputs.parameters.nope}}"]


def test_optional_secret_env_is_omitted_when_the_secret_is_missing(run):
    s = spec(step("s", 'test "${KEY-unset}" = "$WANT"'), dag="    - {name: s, template: s}\n")
    data = s.model_dump(by_alias=True, exclude_none=True)
    data["templates"][0]["container"]["env"] = [
        {"name": "WANT", "value": "unset"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "api-key", "optional": True}}}]
    assert run(WorkflowSpec.model_validate(data)).phase == "Succeeded"
    data["templates"][0]["container"]["env"][0]["value"] = "s3cret"
    assert run(WorkflowSpec.model_validate(data), secrets={"k": {"api-key": "s3cret"}}).phase == "Succeeded"


def test_enum_is_enforced_by_the_ui_only(run):
    """validate.go validateArgumentsValues over util.MergeParameters(submitted, template): a submitted
    parameter carries no enum, so the API accepts it; the UI offers the enum values only."""
    s = spec(step("s", "true"), dag="    - {name: s, template: s}\n")
    assert run(s, parameters={"mode": "zzz"}).phase == "Succeeded"
    with pytest.raises(Rejected):
        run(s, parameters={"mode": "zzz"}, via="ui")


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="podSpecPatch"):
        WorkflowSpec.model_validate({"entrypoint": "x", "podSpecPatch": "{}", "templates": []})
    with pytest.raises(ValidationError, match="sidecars"):
        spec(step("s", "true", "  sidecars: []"))


def test_workflow_mutex_serialises_runs_of_the_same_name(run):
    """spec.synchronization.mutexes: the lock is taken before the workflow starts and released when
    it is done (sync manager TryAcquire/Release); the name is substituted with the parameters."""
    import threading

    s = spec(step("s", "sleep 1"), dag="    - {name: s, template: s}\n")
    s = WorkflowSpec.model_validate({**s.model_dump(by_alias=True, exclude_none=True),
                                     "synchronization": {"mutexes": [{"name": "m-{{workflow.parameters.mode}}"}]}})
    runs = []
    threads = [threading.Thread(target=lambda: runs.append(run(s))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.mutex for r in runs] == ["m-a", "m-a"]
    first, second = sorted(runs, key=lambda r: r.seconds)
    assert second.seconds >= first.seconds + 0.9   # it waited for the other run's whole duration


def test_workflow_mutex_is_per_controller(run, argo_root):
    """A mutex (no `database: true`) lives in the memory of the controller that runs the workflow
    (workflow/sync/sync_manager.go Manager.initializeMutex -> newInternalMutex): two controllers run
    two workflows of one mutex name at the same time.

    Shown by a rendezvous, not by wall time: each run's step marks that it started, then waits (up to
    60 s) until both have started. Held by one mutex, the first run would wait for a second that cannot
    start until it ends, and fail. (It asserted 'each run under 1.9 s' before; a CI run under load took
    1.97 s for a 1 s step, which says nothing about the mutex.)"""
    import tempfile
    import threading
    from pathlib import Path

    meet = Path(tempfile.mkdtemp(dir=argo_root))   # not /tmp: every pod has its own
    wait_for_both = (f"mktemp {meet}/started.XXXXXX > /dev/null; i=0; "
                     f"while [ $(ls {meet} | grep -c started) -lt 2 ]; do "
                     "i=$((i+1)); [ $i -gt 600 ] && exit 1; sleep 0.1; done")
    s = spec(step("s", wait_for_both), dag="    - {name: s, template: s}\n")
    # root: the steps meet on the host (a side channel of the test), in a 0700 folder of root's
    s = WorkflowSpec.model_validate({**s.model_dump(by_alias=True, exclude_none=True), "securityContext": {"runAsUser": 0},
                                     "synchronization": {"mutexes": [{"name": "m-{{workflow.parameters.mode}}"}]}})
    runs = []
    threads = [threading.Thread(target=lambda c=c: runs.append(run(s, controller=c))) for c in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.mutex for r in runs] == ["m-a", "m-a"]
    assert all(r.phase == "Succeeded" for r in runs), "\n".join(r.describe() for r in runs)
    assert len(list(meet.glob("started.*"))) == 2


def test_a_deleted_workflow_runs_nothing_more_not_even_its_exit_handler(run, argo_root):
    """`kubectl delete workflow`: the pods it owns are garbage-collected and the controller forgets
    it; its onExit handler never runs (it runs on `argo stop`, not on deletion)."""
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(dir=argo_root))   # not /tmp: every pod has its own
    mark = tmp_path / "started"
    s = spec(step("long", f"touch {mark}; sleep 30"), step("after", "true"), step("bye", f"touch {tmp_path}/bye"),
             dag="    - {name: long, template: long}\n    - {name: after, template: after, depends: long.Failed}\n")
    # root: the steps write their marks on the host (a side channel of the test), in a 0700 folder of root's
    s = WorkflowSpec.model_validate({**s.model_dump(by_alias=True, exclude_none=True), "onExit": "bye",
                                     "securityContext": {"runAsUser": 0}})
    r = run(s, deleted_when=mark.exists)
    assert r.phase == "Deleted" and r.exit is None and r.seconds < 10, r.describe()
    assert r.task("long").failed_or_error and "the workflow was deleted" in r.task("after").message, r.describe()
    assert not (tmp_path / "bye").exists()


def test_git_input_artifact_is_the_revision_checked_out(run, revision):
    """A `git` input artifact at /workspace/src: `git archive REV` of the repository (the clone the
    executor does); an unknown revision is an Error of that step."""
    from tests.conftest import ROOT

    s = spec(step("s", "test -f overlays/dev/release.yaml && test -f /workspace/src/Makefile", """  inputs:
    artifacts:
    - {name: source, path: /workspace/src, git: {repo: 'https://example.test/pdops.git', revision: '{{workflow.parameters.mode}}'}}"""),
        dag="    - {name: s, template: s}\n")
    data = s.model_dump(by_alias=True, exclude_none=True)
    data["templates"][0]["container"]["workingDir"] = "/workspace/src"
    data["arguments"]["parameters"][0]["enum"] = None
    s = WorkflowSpec.model_validate(data)
    repos = {"https://example.test/pdops.git": ROOT}
    assert run(s, parameters={"mode": revision}, repos=repos).phase == "Succeeded"
    failed = run(s, parameters={"mode": "no-such-ref"}, repos=repos)
    assert failed.task("s").phase == "Error" and "revision not found" in failed.task("s").message


def test_a_feature_not_emulated_fails_the_run_loudly(run):
    """An expression tag raised in a task's thread reaches the test instead of hanging the DAG."""
    s = spec(step("s", "echo {{=sprig.upper('x')}}"), dag="    - {name: s, template: s}\n")
    with pytest.raises(NotEmulated, match="expression tag"):
        run(s)


@pytest.mark.parametrize("optional_argument, phase", [(False, "Error"), (True, "Succeeded")])
def test_from_an_output_artifact_that_was_not_produced(run, optional_argument, phase):
    """An optional output artifact a step did not write is absent from the scope; a task passing it
    on with `from:` Errors ("Unable to resolve") unless the *argument* says optional (dag.go
    resolveDependencyReferences), whatever the consuming template's input says."""
    s = spec(step("make", "exit 1", "  outputs:\n    artifacts: [{name: run, path: /tmp/run, optional: true}]"),
             step("use", "test ! -e /tmp/in/run", "  inputs:\n    artifacts: [{name: run, path: /tmp/in/run, optional: true}]"),
             dag=f"""
    - {{name: make, template: make}}
    - name: use
      template: use
      depends: make.Failed
      arguments: {{artifacts: [{{name: run, from: '{{{{tasks.make.outputs.artifacts.run}}}}', optional: {str(optional_argument).lower()}}}]}}
""")
    r = run(s)
    assert r.task("use").phase == phase, r.describe()
    if phase == "Error":
        assert "Unable to resolve" in r.task("use").message
