"""Argo Events: a GitHub push webhook (HMAC-verified with a Secret reference) and a Sensor that
submits `pd-release` for the one environment whose overlay changed on main.

What a delivery goes through (tests/unit/test_webhook.py evaluates the committed Sensor's filters):
- Signature: the EventSource checks X-Hub-Signature-256 (HMAC-SHA256 of the body with the Secret)
  before any filter and drops the delivery on a mismatch. That part is Argo's; an EventSource
  without `webhookSecret` would accept unsigned deliveries, so the secret must stay set.
- Filters, all of them: the delivery is a `push` (Argo copies X-GitHub-Event into the body; a
  hand-made hook sending every event type is still safe), to refs/heads/main exactly (no other
  branch, no tag), not a branch deletion, and some commit added, modified or removed a file under
  `overlays/<env>/`. Pushes touching only kustomize/ (shared by all environments) or other files
  submit nothing: an environment is released when its overlay changes, or by hand.
- Replay: a redelivered (or replayed) push submits the same revision again. Harmless: `pd-release`
  holds a mutex per environment, so the two runs never overlap, and re-releasing the revision that
  is already stable is a no-op for the target.
- GitHub lists at most the first commits of a very large push; an overlay change past that list
  submits nothing (release it by hand with `argo submit --from workflowtemplate/pd-release`).

Plain dicts on purpose: Hera's Events models dump an inline Workflow trigger resource as `{}`.
"""
from __future__ import annotations

from typing import Any

from workflows.names import ENVIRONMENTS, SENSOR_SERVICE_ACCOUNT, WORKFLOW_NAMESPACE

EVENT_SOURCE = "pdops-github"
EVENT_NAME = "push"
SENSOR = "pdops-release"
WEBHOOK_SECRET = {"name": "pdops-github-webhook", "key": "secret"}   # created out of band, never committed
REPO_OWNER = "pdops"
REPO_NAME = "pdops"
WEBHOOK_URL = "https://argo-events.pdops.example.com"  # public URL GitHub posts to (set per installation)
BRANCH_REF = "refs/heads/main"


def event_source() -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "EventSource",
        "metadata": {"name": EVENT_SOURCE, "namespace": WORKFLOW_NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "pdops"}},
        "spec": {
            "service": {"ports": [{"port": 12000, "targetPort": 12000}]},
            "github": {
                EVENT_NAME: {
                    "repositories": [{"owner": REPO_OWNER, "names": [REPO_NAME]}],
                    "events": ["push"],
                    "contentType": "json",
                    "active": True,
                    "insecure": False,
                    # GitHub signs each delivery (X-Hub-Signature-256, HMAC-SHA256) with this secret;
                    # the event source rejects unsigned or wrongly signed deliveries.
                    "webhookSecret": dict(WEBHOOK_SECRET),
                    "webhook": {"endpoint": "/push", "port": "12000", "method": "POST", "url": WEBHOOK_URL},
                }
            },
        },
    }


def _paths_filter(env: str) -> dict[str, Any]:
    # gjson: every added/modified/removed path of every commit, one flat JSON array; a string data
    # filter regex-matches that array's JSON text (gjson Result.String() of an array is its raw JSON).
    # Without commits the array is `[]`, which matches no environment.
    return {"path": "[body.commits.#.added,body.commits.#.modified,body.commits.#.removed]|@flatten:{\"deep\":true}",
            "type": "string", "value": [f'.*"overlays/{env}/.*']}


def dependency(env: str) -> dict[str, Any]:
    return {
        "name": f"push-{env}",
        "eventSourceName": EVENT_SOURCE,
        "eventName": EVENT_NAME,
        "filters": {
            "dataLogicalOperator": "and",
            "data": [
                # string values are unanchored regexes (Go regexp.Match): anchor them
                {"path": "body.X-GitHub-Event", "type": "string", "value": ["^push$"]},
                {"path": "body.ref", "type": "string", "value": ["^" + BRANCH_REF + "$"]},
                {"path": "body.deleted", "type": "bool", "value": ["false"]},
                _paths_filter(env),
            ],
        },
    }


def trigger(env: str) -> dict[str, Any]:
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": f"pd-release-{env}-", "namespace": WORKFLOW_NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "pdops", "pdops/environment": env,
                                "pdops/trigger": "github-push"}},
        "spec": {
            "workflowTemplateRef": {"name": "pd-release"},
            "arguments": {"parameters": [
                {"name": "environment", "value": env},
                {"name": "revision", "value": "main"},   # replaced by the pushed sha (body.after)
            ]},
        },
    }
    return {
        "template": {
            "name": f"release-{env}",
            "conditions": f"push-{env}",
            "argoWorkflow": {
                "operation": "submit",
                "source": {"resource": workflow},
                "parameters": [{"src": {"dependencyName": f"push-{env}", "dataKey": "body.after"},
                                "dest": "spec.arguments.parameters.1.value"}],
            },
        },
        "retryStrategy": {"steps": 3, "duration": "10s", "factor": 2},
    }


def sensor() -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Sensor",
        "metadata": {"name": SENSOR, "namespace": WORKFLOW_NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "pdops"}},
        "spec": {
            "template": {"serviceAccountName": SENSOR_SERVICE_ACCOUNT},
            "dependencies": [dependency(env) for env in ENVIRONMENTS],
            "triggers": [trigger(env) for env in ENVIRONMENTS],
        },
    }


def objects() -> list[dict[str, Any]]:
    return [event_source(), sensor()]
