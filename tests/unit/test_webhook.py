"""The git-push trigger: what GitHub deliveries make the committed Sensor submit `pd-release`.

Argo Events cannot run here. What we own is its configuration, so the Sensor's data filters from
kustomize/argo/events.yaml are evaluated by a small, faithful copy of Argo Events' `filterData`
(pkg/sensors/dependencies/filter.go, the `and` operator) over a subset of gjson paths, against
realistic GitHub push payloads wrapped the way Argo's GitHub event source wraps them
(`{"header": ..., "body": ...}`, with X-GitHub-Event copied into the body).

The HMAC signature check (X-Hub-Signature-256) is NOT emulated: Argo's event source does it
(go-github ValidatePayload) before any filter and drops a delivery that fails it. What is tested is
the configuration it depends on: a webhookSecret taken from a Kubernetes Secret (with no secret,
ValidatePayload accepts unsigned deliveries).
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from workflows.argo import definitions as argo

ARGO_DIR = ROOT / "kustomize" / "argo"
MISSING = object()


# -- gjson (the subset the Sensor uses; anything else raises, so a new path syntax cannot pass silently)

def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c in "[{"
        depth -= c in "]}"
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _flatten(value: Any, deep: bool) -> Any:
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item in value:
        out += (_flatten(item, deep) if deep else item) if isinstance(item, list) else [item]
    return out


def gjson_get(data: Any, path: str) -> Any:
    """gjson.Get: dot paths, `#` (count, or map over an array), `[a,b]` multipaths (only the paths
    that exist), `|` pipes, `@flatten[:{"deep":true}]`. MISSING where gjson's Exists() is false."""
    if data is MISSING or path == "":
        return data
    if path[0] == "[":
        inner, rest = _split_top(path, "|")[0], "|".join(_split_top(path, "|")[1:])
        assert inner.endswith("]"), path
        found = [v for v in (gjson_get(data, p) for p in _split_top(inner[1:-1], ",")) if v is not MISSING]
        return gjson_get(found, rest)
    if path[0] == "@":
        head, _, rest = path.partition("|")
        name, _, arg = head.partition(":")
        if name != "@flatten":
            raise NotImplementedError(name)
        return gjson_get(_flatten(data, bool(json.loads(arg or "{}").get("deep"))), rest)
    head, _, rest = path.partition("|")
    parts = head.split(".")
    for i, part in enumerate(parts):
        if set(part) & set("*?\\!=<>%@()[]{}") or part == "":
            raise NotImplementedError(part)
        if part == "#":
            if not isinstance(data, list):
                return MISSING
            if i == len(parts) - 1:
                return gjson_get(len(data), rest)
            mapped = [gjson_get(item, ".".join(parts[i + 1:])) for item in data]
            return gjson_get([v for v in mapped if v is not MISSING], rest)
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return MISSING
    return gjson_get(data, rest)


def gjson_string(value: Any) -> str:
    """Result.String(): strings as is, null as "", numbers and booleans as JSON, the rest as raw JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


GO_BOOL = {**dict.fromkeys(["1", "t", "T", "TRUE", "true", "True"], True),    # strconv.ParseBool
           **dict.fromkeys(["0", "f", "F", "FALSE", "false", "False"], False)}


def gjson_bool(value: Any) -> bool:
    """Result.Bool()."""
    if isinstance(value, str):
        return GO_BOOL.get(value.lower(), False)
    return bool(value) if isinstance(value, (bool, int, float)) else False


def _go_regex(pattern: str) -> re.Pattern[str]:
    """Go regexp syntax as Python: `$` without (?m) is the end of the text (Python's also matches before a final newline)."""
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


def data_filters_pass(filters: dict[str, Any], event_data: bytes) -> bool:
    """Argo Events' filterData, `and` operator: every filter must pass; an error (invalid JSON, a
    path that does not exist, no values) counts as not passing, as it stops the trigger there."""
    assert filters.get("dataLogicalOperator", "and") in ("", "and")
    try:
        payload = json.loads(event_data)
    except ValueError:
        return False
    for f in filters.get("data", []):
        assert "template" not in f, "data filter templates are not emulated"
        result = gjson_get(payload, f["path"])
        if result is MISSING or not f.get("value"):
            return False
        comparator = f.get("comparator", "")
        if f["type"] == "string":
            matched = [bool(_go_regex(v).search(gjson_string(result))) for v in f["value"]]
            ok = any(matched) if comparator in ("", "=") else any(not m for m in matched) if comparator == "!=" else False
        elif f["type"] == "bool":
            if not set(f["value"]) <= GO_BOOL.keys():
                return False
            ok = any(GO_BOOL[v] == gjson_bool(result) for v in f["value"])
        else:
            raise NotImplementedError(f["type"])
        if not ok:
            return False
    return True


def submitted(sensor: dict[str, Any], event_data: bytes) -> list[dict[str, Any]]:
    """The Workflows the Sensor would create for one delivery, trigger parameters applied."""
    deps = {d["name"]: d for d in sensor["spec"]["dependencies"]}
    out = []
    for trigger in sensor["spec"]["triggers"]:
        template = trigger["template"]
        dep = deps[template["conditions"]]          # one dependency per trigger: no && / || here
        if not data_filters_pass(dep["filters"], event_data):
            continue
        resource = copy.deepcopy(template["argoWorkflow"]["source"]["resource"])
        for param in template["argoWorkflow"]["parameters"]:
            assert param["src"]["dependencyName"] == dep["name"]
            value = gjson_get(json.loads(event_data), param["src"]["dataKey"])
            *parents, last = param["dest"].split(".")
            target = resource
            for key in parents:
                target = target[int(key)] if key.isdigit() else target[key]
            target[int(last) if last.isdigit() else last] = gjson_string(value)
        out.append(resource)
    return out


# -- GitHub deliveries ------------------------------------------------------------------------------

AFTER = "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
BEFORE = "2e1a4ef1e6a8e8d4f1a39c2b4b01d7d8c3a6f1a2"
ZERO = "0" * 40


def commit(sha: str = AFTER, added=(), modified=(), removed=()) -> dict[str, Any]:
    author = {"name": "Ada", "email": "ada@example.com", "username": "ada"}
    return {"id": sha, "tree_id": "f9d2a07e9488b91af2641b26b9407fe22a451433", "distinct": True,
            "message": "overlays: bump", "timestamp": "2026-12-02T17:00:00Z",
            "url": f"https://github.com/pdops/pdops/commit/{sha}", "author": author, "committer": author,
            "added": list(added), "removed": list(removed), "modified": list(modified)}


def delivery(ref: str = "refs/heads/main", commits=None, *, event: str = "push", deleted: bool = False,
             body: dict[str, Any] | None = None) -> bytes:
    """A delivery as the Sensor sees it: Argo's GithubEventData around GitHub's push payload."""
    commits = [commit(modified=["overlays/prod/release.yaml"])] if commits is None else commits
    payload = body if body is not None else {
        "ref": ref, "before": BEFORE, "after": ZERO if deleted else AFTER,
        "repository": {"id": 1, "name": "pdops", "full_name": "pdops/pdops", "owner": {"login": "pdops"},
                       "default_branch": "main"},
        "pusher": {"name": "ada", "email": "ada@example.com"}, "sender": {"login": "ada", "id": 7},
        "created": False, "deleted": deleted, "forced": False, "base_ref": None,
        "compare": f"https://github.com/pdops/pdops/compare/{BEFORE[:12]}...{AFTER[:12]}",
        "commits": commits, "head_commit": commits[-1] if commits else None,
    }
    delivery_id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    payload = {**payload, "X-GitHub-Event": event, "X-GitHub-Delivery": delivery_id}   # parseValidateRequest
    headers = {"X-Github-Event": [event], "X-Github-Delivery": [delivery_id], "Content-Type": ["application/json"],
               "X-Hub-Signature-256": ["sha256=" + "ab" * 32]}
    return json.dumps({"header": headers, "body": payload}).encode()


@pytest.fixture(scope="module")
def committed():
    """EventSource and Sensor as committed (what Argo CD syncs), not as the Python would build them."""
    docs = [d for d in yaml.safe_load_all((ARGO_DIR / "events.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def environments(sensor, data: bytes) -> set[str]:
    return {wf["spec"]["arguments"]["parameters"][0]["value"] for wf in submitted(sensor, data)}


# -- the emulation itself -----------------------------------------------------------------------------

def test_gjson_subset_matches_gjson_documentation():
    """Examples from gjson's README/SYNTAX.md, so the emulation is checked against the original."""
    doc = {"name": {"first": "Tom", "last": "Anderson"}, "age": 37, "children": ["Sara", "Alex", "Jack"],
           "friends": [{"first": "Dale", "last": "Murphy", "age": 44}, {"first": "Roger", "last": "Craig", "age": 68},
                       {"first": "Jane", "last": "Murphy", "age": 47}]}
    assert gjson_get(doc, "name.last") == "Anderson"
    assert gjson_get(doc, "children.#") == 3 and gjson_get(doc, "children.1") == "Alex"
    assert gjson_get(doc, "friends.#.first") == ["Dale", "Roger", "Jane"]
    assert gjson_get(doc, "friends.1.last") == "Craig"
    assert gjson_get(doc, "[name.first,age,nope]") == ["Tom", 37]
    assert gjson_get(doc, "nope") is MISSING and gjson_get(doc, "[nope]") == []
    nested = [1, [2], [3, 4], [5, [6, 7]]]
    assert gjson_get(nested, "@flatten") == [1, 2, 3, 4, 5, [6, 7]]
    assert gjson_get(nested, '@flatten:{"deep":true}') == [1, 2, 3, 4, 5, 6, 7]
    assert gjson_string(["a", "b"]) == '["a","b"]' and gjson_string(None) == "" and gjson_string(True) == "true"
    with pytest.raises(NotImplementedError):
        gjson_get(doc, "friends.#(last==Murphy)#.first")


def test_data_filter_semantics():
    """filterData: unanchored Go regex, `!=` comparator, a missing path fails, invalid JSON fails."""
    data = json.dumps({"body": {"ref": "refs/heads/main\n", "n": True}}).encode()
    f = lambda *filters: {"data": list(filters)}   # noqa: E731
    assert data_filters_pass(f({"path": "body.ref", "type": "string", "value": ["heads"]}), data)
    assert not data_filters_pass(f({"path": "body.ref", "type": "string", "value": ["^refs/heads/main$"]}), data)
    assert not data_filters_pass(f({"path": "body.ref", "type": "string", "value": ["heads"], "comparator": "!="}), data)
    assert not data_filters_pass(f({"path": "body.nope", "type": "string", "value": [".*"]}), data)
    assert not data_filters_pass(f({"path": "body.ref", "type": "string", "value": []}), data)
    assert data_filters_pass(f({"path": "body.n", "type": "bool", "value": ["true"]}), data)
    assert not data_filters_pass(f({"path": "body.n", "type": "bool", "value": ["false"]}), data)
    assert not data_filters_pass(f({"path": "body.ref", "type": "string", "value": [".*"]}), b"{not json")


# -- (a) the EventSource: signed deliveries only, push only ------------------------------------------

def test_event_source_verifies_signatures_with_a_secret_reference(committed):
    gh = committed["EventSource"]["spec"]["github"]
    (source,) = gh.values()
    assert source["webhookSecret"] == {"name": "pdops-github-webhook", "key": "secret"}   # by reference only
    assert source["events"] == ["push"]
    assert source["webhook"]["url"].startswith("https://") and source["insecure"] is False
    assert "apiToken" not in source     # the hook is registered out of band: no GitHub token in the cluster


def test_every_dependency_requires_a_push_event(committed):
    """The hook asks GitHub for push only, but the event source does not check the event type of
    what arrives: each dependency does (X-GitHub-Event, copied into the body by Argo)."""
    for dep in committed["Sensor"]["spec"]["dependencies"]:
        assert {"path": "body.X-GitHub-Event", "type": "string", "value": ["^push$"]} in dep["filters"]["data"]


# -- (b) which deliveries release what ---------------------------------------------------------------

@pytest.mark.parametrize("name, data, expected", [
    ("push to main touching overlays/prod", delivery(), {"prod"}),
    ("two commits, dev added and staging removed",
     delivery(commits=[commit(added=["overlays/dev/node-groups.yaml"]), commit(removed=["overlays/staging/x.yaml"])]),
     {"dev", "staging"}),
    ("every environment", delivery(commits=[commit(modified=[f"overlays/{e}/release.yaml" for e in argo.ENVIRONMENTS])]),
     set(argo.ENVIRONMENTS)),
    ("push to another branch", delivery("refs/heads/feature/x"), set()),
    ("a branch named like main", delivery("refs/heads/main-hotfix"), set()),
    ("a branch ending in main", delivery("refs/heads/not-main"), set()),
    ("tag push", delivery("refs/tags/v1.2.0"), set()),
    ("deletion of main", delivery(commits=[], deleted=True), set()),
    ("deletion still listing commits", delivery(deleted=True), set()),
    ("README only", delivery(commits=[commit(modified=["README.md"])]), set()),
    ("shared kustomize/ only (released per environment, by hand)",
     delivery(commits=[commit(modified=["kustomize/base/rayservice.yaml"])]), set()),
    ("lookalike paths", delivery(commits=[commit(added=["docs/overlays/prod/x.md", "overlays/production/x.yaml",
                                                        "overlays/prodx/y"])]), set()),
    ("no commits (empty push)", delivery(commits=[]), set()),
    ("ping on hook creation", delivery(event="ping", body={"zen": "Keep it logically awesome.", "hook_id": 1}), set()),
    ("a create event for main", delivery(event="create", body={"ref": "main", "ref_type": "branch"}), set()),
    ("a push payload sent as another event type", delivery(event="workflow_run"), set()),
])
def test_which_deliveries_release_which_environment(committed, name, data, expected):
    assert environments(committed["Sensor"], data) == expected, name


def test_submitted_workflow_releases_the_pushed_revision(committed):
    (wf,) = submitted(committed["Sensor"], delivery())
    assert wf["kind"] == "Workflow" and wf["spec"]["workflowTemplateRef"] == {"name": "pd-release"}
    assert wf["spec"]["arguments"]["parameters"] == [{"name": "environment", "value": "prod"},
                                                     {"name": "revision", "value": AFTER}]
    assert wf["metadata"]["generateName"] == "pd-release-prod-"


def test_payload_cannot_inject_into_other_parameters(committed):
    """Only body.after reaches the Workflow, and only as the revision value (git checks it is a ref)."""
    params = [p for t in committed["Sensor"]["spec"]["triggers"] for p in t["template"]["argoWorkflow"]["parameters"]]
    assert {(p["src"]["dataKey"], p["dest"]) for p in params} == {("body.after", "spec.arguments.parameters.1.value")}


# -- (c) replay ------------------------------------------------------------------------------------

def test_replayed_delivery_submits_the_same_revision_again_under_the_environment_mutex(committed):
    """GitHub redelivery (or an attacker replaying a captured, validly signed delivery) re-submits
    the same environment at the same revision. Harmless by design: pd-release holds a mutex per
    environment (runs never overlap) and releasing the already-stable revision is a no-op."""
    data = delivery()
    first, second = submitted(committed["Sensor"], data), submitted(committed["Sensor"], data)
    assert first == second and len(first) == 1
    (template,) = [d for d in yaml.safe_load_all((ARGO_DIR / "pd-release.yaml").read_text()) if d]
    assert template["spec"]["synchronization"] == {"mutexes": [{"name": "pd-release-{{workflow.parameters.environment}}"}]}
    assert first[0]["spec"]["arguments"]["parameters"][0]["name"] == "environment"
