"""`pdops render` output equals what the Kubernetes target applies (issue 22): a user who applies the
render of an overlay with kubectl, Argo CD or Flux gets the objects pdops itself would apply, except
for the per-colour edits that make blue/green possible.

For every object in the render of each committed overlay (overlays/*), what the target sends
(`release_objects` on rollout, `stable_service` on promote) must equal the rendered object with exactly
the edits workflows/targets/kube/objects.py documents, and nothing else:
- every object: metadata.namespace (the target's; the render already carries the overlay's);
- RayService: name `<name>-<colour>`, labels pdops.dev/colour and pdops.dev/release, annotations
  pdops.dev/digest and pdops.dev/revision, pdops.dev/colour on every pod template;
- PodDisruptionBudget: name `<name>-<colour>`, label and selector pdops.dev/colour;
- Service (promote): annotations pdops.dev/colour, digest and revision, selector pdops.dev/colour;
- ServiceAccount, PodMonitor: nothing.
A field the target adds, drops or changes beyond these fails here (before the PodMonitor's
podTargetLabels were rendered, the target added them at apply time only: 3 overlays x 2 colours failed).

Nothing is emulated: the render is kustomize's (the pinned kubectl) plus pdops's, and the objects are
the target's own builders, before they go to the API server.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import OVERLAYS, ROOT
from workflows.names import COLOUR_LABEL, DIGEST_ANNOTATION, PHASE_LABEL, RELEASE_LABEL, REVISION_ANNOTATION
from workflows.render.manifest import dump_manifest, render
from workflows.targets.base import ReleaseRecord
from workflows.targets.kube.objects import check, release_objects, stable_service

COLOURS = ("blue", "green")
CASES = [(env, colour) for env in OVERLAYS for colour in COLOURS]


def _record(objects: list[dict[str, Any]], colour: str) -> ReleaseRecord:
    rec = ReleaseRecord.of(dump_manifest(objects), name="pd-llm", model="m", revision="a" * 40)
    rec.colour = colour
    return rec


def _namespace(objects: list[dict[str, Any]]) -> str:
    (namespace,) = {o["metadata"]["namespace"] for o in objects}   # kustomize's `namespace:` puts it on all
    return namespace


def _documented(rendered: dict[str, Any], rec: ReleaseRecord, namespace: str) -> dict[str, Any]:
    """The rendered object with the per-colour, per-namespace edits objects.py documents, and only those."""
    obj = copy.deepcopy(rendered)
    meta, colour = obj["metadata"], rec.colour
    meta["namespace"] = namespace
    if obj["kind"] == "RayService":
        meta["name"] = f"{meta['name']}-{colour}"
        meta.setdefault("labels", {}).update({COLOUR_LABEL: colour, RELEASE_LABEL: rec.name})
        meta.setdefault("annotations", {}).update({DIGEST_ANNOTATION: rec.digest, REVISION_ANNOTATION: rec.revision})
        cluster = obj["spec"]["rayClusterConfig"]
        for group in [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]:
            group["template"]["metadata"]["labels"][COLOUR_LABEL] = colour
    elif obj["kind"] == "PodDisruptionBudget":
        meta["name"] = f"{meta['name']}-{colour}"
        meta.setdefault("labels", {})[COLOUR_LABEL] = colour
        obj["spec"]["selector"]["matchLabels"][COLOUR_LABEL] = colour
    elif obj["kind"] == "Service":
        meta.setdefault("annotations", {}).update({COLOUR_LABEL: colour, DIGEST_ANNOTATION: rec.digest,
                                                   REVISION_ANNOTATION: rec.revision})
        obj["spec"]["selector"][COLOUR_LABEL] = colour
    return obj


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


@pytest.mark.parametrize(("env", "colour"), CASES, ids=[f"{e}-{c}" for e, c in CASES])
def test_what_the_target_applies_is_the_render_with_only_the_documented_per_colour_edits(
        rendered_overlays, env, colour):
    objects = copy.deepcopy(rendered_overlays[env].objects)
    rec, namespace = _record(objects, colour), _namespace(objects)
    check(rec, namespace)    # the target's own precondition: every kind is one it applies
    applied = {_key(o): o for o in [*release_objects(rec, namespace), stable_service(rec, namespace)]}
    expected = {_key(e): e for e in (_documented(o, rec, namespace) for o in objects)}
    assert sorted(applied) == sorted(expected), f"{env}: the target applies other objects than the render holds"
    assert {kind for kind, _ in applied} == {o["kind"] for o in objects}
    for key, obj in expected.items():
        assert applied[key] == obj, f"{env} {colour}: {key[0]}/{key[1]} as applied differs from the render " \
                                    "beyond the documented per-colour edits"


def test_every_monitored_overlay_renders_the_podmonitor_with_the_slot_target_labels(rendered_overlays):
    """The labels the PodMonitor copies onto each series are ones the engine pods carry once applied:
    colour on every pod template (put there per slot), phase on every worker template (kustomize/base),
    and the PodMonitor selects those pods. prometheus-operator copies each podTargetLabels pod label
    onto the target (pkg/prometheus/promcfg.go generatePodMonitorConfig: __meta_kubernetes_pod_label_<l>,
    regex (.+)), so a pod missing one would give series the slot selection (traffic.py) never finds."""
    monitored = [env for env in OVERLAYS if any(o["kind"] == "PodMonitor" for o in rendered_overlays[env].objects)]
    assert {"staging", "prod"} <= set(monitored)
    for env in monitored:
        objects = copy.deepcopy(rendered_overlays[env].objects)
        (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
        assert monitor["spec"]["podTargetLabels"] == [COLOUR_LABEL, PHASE_LABEL], env
        rec = _record(objects, "green")
        (rs,) = [o for o in release_objects(rec, _namespace(objects)) if o["kind"] == "RayService"]
        for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            labels = group["template"]["metadata"]["labels"]
            assert labels[COLOUR_LABEL] == "green" and labels[PHASE_LABEL] == group["groupName"], (env, labels)
            assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), (env, labels)


def test_a_release_recorded_before_render_listed_the_target_labels_is_applied_with_them(rendered_overlays):
    """The target's conversion (objects.py): a manifest recorded in the history before `pdops render`
    emitted podTargetLabels (a restore, `rollback --to-previous`) is applied in today's form."""
    objects = copy.deepcopy(rendered_overlays["prod"].objects)
    now = next(o for o in release_objects(_record(objects, "blue"), "llm-prod") if o["kind"] == "PodMonitor")
    for o in objects:
        if o["kind"] == "PodMonitor":
            del o["spec"]["podTargetLabels"]
    old = next(o for o in release_objects(_record(objects, "blue"), "llm-prod") if o["kind"] == "PodMonitor")
    assert old == now and old["spec"]["podTargetLabels"] == [COLOUR_LABEL, PHASE_LABEL]


def test_a_podmonitor_an_overlay_brings_itself_is_rendered_with_the_target_labels(tmp_path):
    """Not only the monitoring component's: render lists them on any PodMonitor (workflows/render/monitor.py),
    after the labels the overlay lists itself."""
    import shutil

    shutil.copytree(ROOT / "kustomize", tmp_path / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", tmp_path / "overlays" / "local")
    own = tmp_path / "overlays" / "local" / "podmonitor.yaml"
    own.write_text("apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: mine}\n"
                   "spec:\n  selector: {matchLabels: {app.kubernetes.io/name: pd-llm}}\n"
                   "  podTargetLabels: [team]\n  podMetricsEndpoints: [{port: metrics}]\n")
    kustomization = tmp_path / "overlays" / "local" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("  - ../../kustomize/base\n",
                                                               "  - ../../kustomize/base\n  - podmonitor.yaml\n"))
    rendered = render(tmp_path / "overlays" / "local", validate_serve_config=False)
    (monitor,) = [o for o in rendered.objects if o["kind"] == "PodMonitor"]
    assert monitor["spec"]["podTargetLabels"] == ["team", COLOUR_LABEL, PHASE_LABEL]
