"""The Argo pipeline manifests: committed == generated, structure, RBAC, Events, pinned CRD schemas."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re

import pytest
import yaml

from tests.conftest import ROOT, SCHEMAS
from workflows.argo import definitions as argo, events, rbac

ARGO_DIR = ROOT / "kustomize" / "argo"
FILES = ("pd-release.yaml", "pd-canary.yaml", "events.yaml", "rbac.yaml", "kustomization.yaml")


@pytest.fixture(scope="module")
def objects():
    return argo.render_objects()


@pytest.fixture(scope="module")
def release(objects):
    (wt,) = objects["pd-release.yaml"]
    return wt


@pytest.fixture(scope="module")
def canary(objects):
    (cw,) = objects["pd-canary.yaml"]
    return cw


def wfspec(obj: dict) -> dict:
    """The workflow spec of a WorkflowTemplate or CronWorkflow."""
    return obj["spec"].get("workflowSpec", obj["spec"])


def templates(spec: dict) -> dict[str, dict]:
    return {t["name"]: t for t in spec["templates"]}


def tasks(spec: dict, dag: str) -> dict[str, dict]:
    return {t["name"]: t for t in templates(spec)[dag]["dag"]["tasks"]}


def params(spec: dict) -> dict[str, dict]:
    return {p["name"]: p for p in spec["arguments"]["parameters"]}


# -- committed == generated -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered():
    return argo.render_all()


def test_committed_yaml_matches_render_all(rendered):
    assert set(rendered) == set(FILES)
    drifted = [n for n, text in rendered.items()
               if not (ARGO_DIR / n).exists() or (ARGO_DIR / n).read_text(encoding="utf-8") != text]
    assert not drifted, f"{drifted} drifted from workflows/argo/definitions.py: run `pdops workflows render --out kustomize/argo`"


def test_kustomization_lists_every_file():
    k = yaml.safe_load((ARGO_DIR / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(set(FILES) - {"kustomization.yaml"})


def test_render_all_round_trips(rendered, objects):
    for name, objs in objects.items():
        assert list(yaml.safe_load_all(rendered[name])) == objs, name


def test_cli_workflows_render(tmp_path):
    from workflows.cli.main import build_parser

    args = build_parser().parse_args(["workflows", "render", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert {p.name for p in tmp_path.iterdir()} == set(FILES)


def test_register_adds_workflows_subcommand():
    parser = argparse.ArgumentParser()
    argo.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["workflows", "render", "--out", "x"])
    assert callable(args.func) and args.out == "x"


# -- pd-release -----------------------------------------------------------------------------------

def test_release_parameters_have_enums_or_say_free_text(release, canary):
    """Manual runs from the Argo UI: every parameter is an enum or documented free text."""
    p = params(release["spec"])
    assert set(p) == {"environment", "revision", "skip-to-rollback", "dry-run", "repo-url", "step-image"}
    assert p["environment"]["enum"] == list(argo.ENVIRONMENTS) and p["environment"]["value"] == "dev"
    assert p["dry-run"]["enum"] == ["false", "true"] and p["dry-run"]["value"] == "false"
    assert p["skip-to-rollback"]["enum"] == ["false", "true"] and p["skip-to-rollback"]["value"] == "false"
    assert p["step-image"]["value"] == argo.STEP_IMAGE
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        for name, param in params(spec).items():
            assert "enum" in param or param["description"].startswith("free text"), name


def test_release_dag_is_check_rollout_validate_then_promote_or_rollback(release):
    t = tasks(release["spec"], "release")
    assert set(t) == {"lock", "check", "rollout", "validate", "promote", "rollback", "skip-to-rollback"}
    assert t["check"]["depends"] == t["skip-to-rollback"]["depends"] == "lock.Succeeded || lock.Skipped"
    assert t["rollout"]["depends"] == "check.Succeeded" and t["validate"]["depends"] == "rollout.Succeeded"
    verdict = "{{tasks.validate.outputs.parameters.verdict}}"
    assert t["promote"] | {"arguments": None} == {"name": "promote", "template": "promote", "arguments": None,
                                                  "depends": "validate.Succeeded", "when": f"'{verdict}' == 'promote'"}
    # a rollback verdict exits 1 (the workflow shows Failed), so the rollback must also follow a Failed validate
    assert t["rollback"]["depends"] == "validate.Succeeded || validate.Failed"
    assert t["rollback"]["when"] == f"'{verdict}' != 'promote'"


def test_nothing_about_what_is_validated_lives_in_the_yaml(release, canary):
    """The overlay's release.yaml decides loads, thresholds and suites: no load flag in any step."""
    text = yaml.safe_dump(release) + yaml.safe_dump(canary)
    for flag in ("--concurrency", "--requests", "--profile", "--rate", "--metrics-url", "--optional", "--model"):
        assert flag not in text, flag


def _pdops_invocations(wf: dict):
    for tpl in wfspec(wf)["templates"]:
        c = tpl.get("container")
        if c and c["command"] == ["pdops"]:
            yield tpl["name"], c["args"]


@pytest.mark.parametrize("name", ["pd-release.yaml", "pd-canary.yaml"])
def test_every_pdops_call_in_the_committed_yaml_parses_with_the_cli_parser(name):
    """The Argo -> CLI contract, read from the COMMITTED YAML: argparse exits 2 on an unknown flag
    (as `--endpoint-out` did), so every call must parse, with {{...}} standing for a value."""
    from workflows.cli.main import build_parser

    (wf,) = [d for d in yaml.safe_load_all((ARGO_DIR / name).read_text()) if d]
    calls = list(_pdops_invocations(wf))
    assert len(calls) >= 2
    parser = build_parser()
    for step, args in calls:
        filled = [re.sub(r"{{[^}]+}}", "x", a) for a in args]
        filled = [a.replace("--dry-run=x", "--dry-run=false") for a in filled]
        try:
            parsed = parser.parse_args(filled)
        except SystemExit as exc:
            pytest.fail(f"{name} step {step}: `pdops {' '.join(args)}` is rejected by the CLI (exit {exc.code})")
        assert callable(parsed.func), step
    # and a wrong flag is caught the same way (so the test above can fail)
    with pytest.raises(SystemExit):
        parser.parse_args(["rollout", "--target", "kubernetes", "--endpoint-out", "/tmp/endpoint"])


@pytest.mark.parametrize("name", ["release", "canary"])
def test_no_continue_on_with_depends(release, canary, name):
    """Argo's CRD CEL rule: `cannot use 'continueOn' when using 'depends'` (and not depends + dependencies)."""
    spec = wfspec(release if name == "release" else canary)
    for tpl in spec["templates"]:
        for task in (tpl.get("dag") or {}).get("tasks", []):
            assert not ("depends" in task and "continueOn" in task), task["name"]
            assert not ("depends" in task and "dependencies" in task), task["name"]


def test_parameters_reach_shell_only_through_env(release, canary):
    """`sh -c` scripts read parameters from env vars, never by {{...}} substitution (no injection)."""
    for wf in (release, canary):
        for tpl in wfspec(wf)["templates"]:
            c = tpl.get("container")
            if c and c["command"][0] == "sh":
                assert "{{" not in c["args"][0], tpl["name"]


def test_retries_only_on_the_transient_exit_code_and_outlast_the_deadline(release, canary):
    """Argo stops retrying once backoff.maxDuration has passed since the first try
    (workflow/controller/operator.go processNodeRetries): it must exceed every try's deadline."""
    for wf in (release, canary):
        spec = wfspec(wf)
        assert "retryStrategy" not in spec
        for tpl in spec["templates"]:
            rs = tpl.get("retryStrategy")
            if rs is None:
                continue
            assert rs["expression"] == "asInt(lastRetry.exitCode) == 75" and rs["retryPolicy"] == "Always"
            assert int(rs["backoff"]["maxDuration"].rstrip("s")) > (rs["limit"] + 1) * tpl["activeDeadlineSeconds"]


def test_deadlines_outlast_the_cli_timeouts(release, canary):
    """Derived from the spec timeouts: each step's deadline contains its waits plus the margin, each
    maxDuration every try, the workflow the longest chain (checks/deadlines.py, Argo v4 semantics)."""
    from workflows.checks.deadlines import problems

    assert release["spec"]["activeDeadlineSeconds"] == argo.WORKFLOW_DEADLINE
    assert canary["spec"]["workflowSpec"]["activeDeadlineSeconds"] == argo.CANARY_DEADLINE
    timeouts = argo.pipeline_timeouts()
    assert problems(release, timeouts) == [] and problems(canary, timeouts) == []
    waits = timeouts.step_waits()
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        for tpl in spec["templates"]:
            if "container" in tpl:
                assert 0 < tpl["activeDeadlineSeconds"] <= spec["activeDeadlineSeconds"], tpl["name"]
    rollback = templates(canary["spec"]["workflowSpec"])["rollback"]
    assert rollback["activeDeadlineSeconds"] >= waits["rollback"] == timeouts.restore_s + 300 + timeouts.drain_s
    chain = [templates(release["spec"])[n]["activeDeadlineSeconds"]
             for n in ("check", "rollout", "validate", "rollback")]
    assert sum(chain) <= argo.WORKFLOW_DEADLINE
    # a wider timeout in one overlay widens the workflow
    wider = timeouts.model_copy(update={"restore_s": timeouts.restore_s + 600})
    assert argo.deadlines(wider)["rollback"] == argo.DEADLINES["rollback"] + 600


def test_exit_handler_rolls_back_pending_candidate(release):
    spec = release["spec"]
    assert spec["onExit"] == "exit-handler"
    task, unlock = templates(spec)["exit-handler"]["dag"]["tasks"]
    assert task["when"] == "{{workflow.status}} != Succeeded"
    args = templates(spec)[task["template"]]["container"]["args"]
    assert args[0] == "rollback" and "--if-candidate-pending" in args
    # then the run's Lease is released, whatever the rollback ended with
    assert templates(spec)[unlock["template"]]["container"]["args"][:4] == ["run", "end", "--run-id", "{{workflow.name}}"]
    assert all(f"rollback-if-pending.{s}" in unlock["depends"] for s in ("Succeeded", "Failed", "Errored", "Skipped"))


def test_every_writing_step_holds_the_runs_lease(release, canary):
    """The first task takes the Lease (`pdops run start`); every step runs with PDOPS_RUN_ID = the workflow name."""
    for wf, entry in ((release, "release"), (canary, "canary")):
        spec = wfspec(wf)
        first = [t for t in tasks(spec, entry).values() if "depends" not in t]
        assert [t["name"] for t in first] == ["lock"]
        assert templates(spec)["lock"]["container"]["args"][:2] == ["run", "start"]
        for tpl in spec["templates"]:
            if (tpl.get("container") or {}).get("command") == ["pdops"]:
                env = {e["name"]: e.get("value") for e in tpl["container"]["env"]}
                assert env["PDOPS_RUN_ID"] == "{{workflow.name}}", tpl["name"]


def test_mutex_per_environment(release, canary):
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        assert spec["synchronization"] == {"mutexes": [{"name": "pd-release-{{workflow.parameters.environment}}"}]}


def test_every_step_that_can_end_a_run_says_why(release, canary):
    """verdict and summary are global outputs of every step that can end a run, with a default
    that says what it means when the step died before writing them."""
    for wf, enders in ((release, ("check", "rollout", "validate", "skip-to-rollback")), (canary, ("validate-stable",))):
        tpl = templates(wfspec(wf))
        for name in enders:
            outs = {p["name"]: p for p in tpl[name]["outputs"]["parameters"]}
            assert outs["verdict"]["globalName"] == "verdict" and outs["summary"]["globalName"] == "summary"
            assert outs["verdict"]["valueFrom"]["default"] in ("blocked", "failed"), name


def test_prometheus_metrics_on_every_path(release):
    metrics = release["spec"]["metrics"]["prometheus"]
    by_name: dict[str, list] = {}
    for mt in metrics:
        by_name.setdefault(mt["name"], []).append(mt)
    assert {"pd_release_ttft_ms", "pd_release_itl_ms", "pd_release_verdict_total"} <= set(by_name)
    (counter,) = by_name["pd_release_verdict_total"]
    assert "when" not in counter and counter["counter"]["value"] == "1"   # emitted whatever the verdict
    globals_ = {p["globalName"] for p in templates(release["spec"])["validate"]["outputs"]["parameters"]}
    for mt in by_name["pd_release_ttft_ms"] + by_name["pd_release_itl_ms"]:
        assert mt["gauge"]["value"][30:-2] in globals_ and "promote" in mt["when"]


def test_security(release, canary):
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        assert spec["serviceAccountName"] == "pd-release"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        (vol,) = spec["volumes"]
        assert "emptyDir" in vol
        for tpl in spec["templates"]:
            if "container" in tpl:
                c = tpl["container"]
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, tpl["name"]
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert {"name": vol["name"], "mountPath": "/tmp"} in c["volumeMounts"]


def test_no_secrets_inline(objects):
    """Secrets only by reference (tests/unit/test_safety.py checks every env var and parameter)."""
    text = json.dumps(objects).lower()
    for word in ("password", "token:", "apikey", "bearer"):
        assert word not in text


# -- pd-canary ------------------------------------------------------------------------------------

def test_canary_schedule_and_policy(canary):
    spec = canary["spec"]
    assert canary["kind"] == "CronWorkflow" and canary["metadata"]["name"] == "pd-canary"
    assert spec["schedules"] == ["*/30 * * * *"]   # Argo v4: `schedule` was removed
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1


def test_canary_validates_stable_and_reacts_to_regression(canary):
    spec = canary["spec"]["workflowSpec"]
    p = params(spec)
    assert p["on-regression"]["enum"] == ["rollback", "alert"] and p["on-regression"]["value"] == "rollback"
    # the exit handler removes what the run started (reference/baseline RayServices) and releases the Lease
    assert spec["onExit"] == "exit-handler"
    (cleanup,) = templates(spec)["exit-handler"]["dag"]["tasks"]
    assert "when" not in cleanup and "--remove-started" in templates(spec)[cleanup["template"]]["container"]["args"]
    assert p["environment"]["value"] == "prod"
    tpl = templates(spec)
    assert "rollout" not in tpl and "promote" not in tpl       # validates the stable release only
    args = tpl["validate-stable"]["container"]["args"]
    assert args[:1] == ["validate"] and args[args.index("--slot") + 1] == "stable"
    t = tasks(spec, "canary")
    assert t["rollback"]["when"].endswith("{{workflow.parameters.on-regression}} == rollback")
    assert "--to-previous" in tpl["rollback"]["container"]["args"]


# -- RBAC -----------------------------------------------------------------------------------------

def test_rbac_namespaced_least_privilege(objects):
    objs = objects["rbac.yaml"]
    kinds = {o["kind"] for o in objs}
    assert kinds == {"ServiceAccount", "Role", "RoleBinding"}
    assert not any(o["kind"].startswith("Cluster") for f in objects.values() for o in f)
    for o in objs:
        assert o["metadata"].get("namespace"), o["metadata"]["name"]
        for s in o.get("subjects", []):
            assert s["namespace"]
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "pd-release"]
    assert {r["metadata"]["namespace"] for r in roles} == set(argo.ENV_NAMESPACES.values())
    # The exact grants are pinned in ONE place: tests/unit/test_rbac.py (GRANTS, with why).
    for o in objs:
        for r in o.get("rules", []):
            assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]


def test_rbac_sensor_may_only_submit_pd_release(objects):
    objs = objects["rbac.yaml"]
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == rbac.SENSOR_SERVICE_ACCOUNT]
    assert role["rules"] == rbac.SENSOR_RULES    # each verb pinned with its upstream caller in test_rbac.py
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    assert names == {"pd-release", rbac.SENSOR_SERVICE_ACCOUNT}
    assert events.sensor()["spec"]["template"]["serviceAccountName"] == rbac.SENSOR_SERVICE_ACCOUNT


# -- Argo Events ----------------------------------------------------------------------------------

def test_event_source_hmac_secret_is_a_reference(objects):
    es, _ = objects["events.yaml"]
    gh = es["spec"]["github"][events.EVENT_NAME]
    assert gh["webhookSecret"] == {"name": "pdops-github-webhook", "key": "secret"}
    assert gh["events"] == ["push"]


def test_sensor_one_trigger_per_environment_with_filters(objects):
    _, sensor = objects["events.yaml"]
    deps = {d["name"]: d for d in sensor["spec"]["dependencies"]}
    trigs = sensor["spec"]["triggers"]
    assert len(trigs) == len(argo.ENVIRONMENTS)
    for env, trig in zip(argo.ENVIRONMENTS, trigs):
        dep = deps[trig["template"]["conditions"]]
        data = dep["filters"]["data"]
        assert {"path": "body.ref", "type": "string", "value": ["^refs/heads/main$"]} in data
        assert dep["filters"]["dataLogicalOperator"] == "and"
        (paths,) = [f for f in data if "commits" in f["path"]]
        assert paths["value"] == [f'.*"overlays/{env}/.*']
        assert paths["path"].startswith("[body.commits.#.added,body.commits.#.modified,body.commits.#.removed]")
        wf = trig["template"]["argoWorkflow"]["source"]["resource"]
        assert wf["spec"]["workflowTemplateRef"] == {"name": "pd-release"}
        args = wf["spec"]["arguments"]["parameters"]
        assert args[0] == {"name": "environment", "value": env}
        (param,) = trig["template"]["argoWorkflow"]["parameters"]
        assert param["src"]["dataKey"] == "body.after"
        index = int(param["dest"].split(".")[-2])
        assert args[index]["name"] == "revision"


# -- step helpers ---------------------------------------------------------------------------------

def test_step_outputs_figures_are_nan_never_a_fake_zero(tmp_path):
    from workflows.pipeline import step_outputs

    bench = {"ttft_ms": {"p50": 12.5, "p99": 40}, "itl_ms": {"p50": 3, "p99": 9},
             "server": {"kv": {"external_kv_prompt_tokens": 1000}}}
    assert step_outputs.figures([bench]) == {"ttft-p50-ms": "12.5", "ttft-p99-ms": "40", "itl-p50-ms": "3",
                                             "itl-p99-ms": "9", "kv-prompt-tokens": "1000"}
    assert set(step_outputs.figures([{}]).values()) == {"NaN"}
    step_outputs.write(tmp_path, "rollback", "# why\n", [bench])
    assert (tmp_path / "verdict").read_text() == "rollback" and (tmp_path / "ttft-p99-ms").read_text() == "40"
    with pytest.raises(ValueError):
        step_outputs.write(tmp_path, "maybe", "")


# -- pinned schemas -------------------------------------------------------------------------------

schema_module = importlib.util.find_spec("workflows.checks.schema")


@pytest.mark.skipif(schema_module is None, reason="workflows.checks.schema not available")
@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"pinned schemas not found at {SCHEMAS}")
def test_rendered_objects_validate_against_pinned_crds(objects):
    from workflows.checks.schema import validate_objects

    errors = [f.render() for name, objs in objects.items() for f in validate_objects(objs, SCHEMAS, name)
              if f.severity == "error"]
    assert not errors, "\n".join(errors)


@pytest.mark.skipif(schema_module is None, reason="workflows.checks.schema not available")
@pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"pinned schemas not found at {SCHEMAS}")
def test_schema_validation_catches_continue_on_with_depends(release):
    """The schema check this file relies on does see the CEL rule (so the test above means something)."""
    from workflows.checks.schema import validate_objects

    broken = copy.deepcopy(release)
    for tpl in broken["spec"]["templates"]:
        if tpl["name"] == "release":
            tpl["dag"]["tasks"][1]["continueOn"] = {"failed": True}
    findings = validate_objects([broken], SCHEMAS, "pd-release.yaml")
    assert any("continueOn" in f.message for f in findings if f.severity == "error"), findings
