"""The git-push trigger end to end: a GitHub push delivery -> the committed Sensor's filters and
trigger parameters (tests/unit/test_webhook.py, a copy of Argo Events' filterData over gjson) -> the
exact Workflow it submits -> Argo's submit validation against the committed WorkflowTemplate
(validate.go ValidateWorkflow with MergeParameters) -> its run in the execution tier.

Not emulated: the HMAC check of the event source, and the API calls of Argo Events' argoWorkflow
trigger (RBAC): the Sensor is trusted to submit what `submitted()` computes.
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.argo.scenario import ARGO, committed
from tests.argo.test_release import verdict_series
from tests.argo.validate import validate_submission
from tests.unit.test_webhook import AFTER, commit, delivery, submitted

SENSOR = next(d for d in yaml.safe_load_all((ARGO / "events.yaml").read_text()) if d and d["kind"] == "Sensor")
TEMPLATE = next(d for d in yaml.safe_load_all((ARGO / "pd-release.yaml").read_text()) if d)


@pytest.mark.parametrize("env", ["dev", "staging", "prod"])
def test_push_for_an_environment_submits_a_workflow_argo_accepts(env):
    data = delivery(commits=[commit(modified=[f"overlays/{env}/release.yaml"])])
    (wf,) = submitted(SENSOR, data)
    assert wf["kind"] == "Workflow" and wf["spec"]["workflowTemplateRef"]["name"] == TEMPLATE["metadata"]["name"]
    assert wf["metadata"]["namespace"] == TEMPLATE["metadata"]["namespace"]
    params = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    merged = {p.name: p.value for p in validate_submission(committed("pd-release.yaml"), params, via="api")}
    defaults = {p.name: p.value for p in committed("pd-release.yaml").arguments.parameters}
    assert merged == {**defaults, "environment": env, "revision": AFTER}


def test_push_to_dev_releases_the_pushed_revision(pipeline):
    body = json.loads(delivery(commits=[commit(modified=["overlays/dev/release.yaml"])]))["body"]
    body["after"] = pipeline.revision                # a commit the (emulated) git server has
    (wf,) = submitted(SENSOR, json.dumps({"header": {}, "body": body}).encode())
    params = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    run = pipeline.submit("pd-release.yaml", params, via="api")
    assert run.phase == "Succeeded", run.describe()
    assert pipeline.history()[-1]["revision"] == pipeline.revision
    assert [v for v, _, _ in verdict_series(run)] == ["promote"]
