"""The scheduled canary (pd-canary's `pdops validate --slot stable`) on the test cluster (tests/fakes/kube):
what it judges the serving release by. See tests/unit/test_kube_reference.py for what the emulator covers."""
from __future__ import annotations

import pytest
import yaml

from tests.kube_support import Lines, record as _record, target as _target
from tests.unit import test_kube_reference
from workflows.pipeline import steps
from workflows.render.manifest import render
from workflows.spec.release import load_spec
from workflows.targets.base import TargetError

overlay = test_kube_reference.overlay   # its fixture, as a name of this module (imported, the arguments shadowed it: F811)


def _tight(path):
    """The branch head moved on: SLOs no engine can meet (a 0.001 ms TTFT p90)."""
    spec = yaml.safe_load((path / "release.yaml").read_text())
    spec["slo"]["prefill"] = {"ttft_p90_ms": 0.001, "ttft_p99_ms": 0.002}
    spec["validation"].update(diff=False, reference="none")
    (path / "release.yaml").write_text(yaml.safe_dump(spec))


def _serving(dns, manifests, spec):
    """A release promoted with `spec` recorded (as rollout records it: steps.record_of); its engines
    are the emulator's default OpenAI fakes (the dns fixture's DiffFake answers no compat suite)."""
    dns.kuberay.engine = {}
    target = _target(dns, reference_timeout_s=30)
    rec = _record(manifests).model_copy(update={"spec": spec.model_dump(mode="json") if spec else None})
    target.apply(rec, Lines())
    target.wait_ready(30, Lines())
    target.promote(["ok"], None, Lines())
    return target, rec


def _judged_by(target, spec, tmp_path, name, monkeypatch, rendered=None, progress=None):
    """The spec and render validate_slot runs the stable slot's validation with. (The verdict itself
    needs traffic through the user-facing Service's cluster DNS name, which the async OpenAI client
    of the compat suite does not resolve through the emulator's DNS: checked by judged spec here.)"""
    seen = {}

    def validate_candidate(endpoint, spec, run, progress, *args, **kwargs):
        # validate_slot passes (reference, baseline, api_key, current, rendered) positionally
        seen.update(spec=spec, rendered=args[4])
        raise _Stop
    monkeypatch.setattr(steps, "validate_candidate", validate_candidate)
    run = tmp_path / name
    run.mkdir()
    with pytest.raises(_Stop):
        steps.validate_slot(target, spec, run, progress if progress is not None else Lines(), slot="stable",
                            rendered=rendered)
    return seen


class _Stop(Exception):
    pass


def test_the_canary_judges_the_serving_release_by_its_recorded_spec_not_the_branch_head(
        dns, manifests, overlay, tmp_path, monkeypatch):
    served = load_spec(overlay)
    target, rec = _serving(dns, manifests, served)
    _tight(overlay)                  # the branch head after the promote: other SLOs
    head = load_spec(overlay)
    assert head.slo != served.slo

    progress = Lines()
    seen = _judged_by(target, None, tmp_path, "canary", monkeypatch,
                      render(overlay, validate_serve_config=False), progress)
    assert seen["spec"] == served and seen["spec"].slo.prefill == served.slo.prefill != head.slo.prefill
    assert f"[validate] stable judged by the spec recorded with {rec.short()} (revision {rec.revision})" in progress
    # the head renders another release: its nodes' prices and balance patch would describe that one
    assert seen["rendered"] is None
    assert any("cost, balance advice and diff are skipped" in line for line in progress)
    # --spec-from-overlay (an explicit spec): judged by what it is given
    given = render(overlay, validate_serve_config=False)
    explicit = _judged_by(target, head, tmp_path, "explicit", monkeypatch, given)
    assert explicit["spec"] == head and explicit["rendered"] is given


def test_a_serving_release_with_no_recorded_spec_fails_closed_naming_the_fix(dns, manifests, tmp_path):
    target, rec = _serving(dns, manifests, None)
    with pytest.raises(TargetError) as exc:
        steps.validate_slot(target, None, tmp_path, Lines(), slot="stable")
    assert exc.value.problem.startswith(f"the serving release {rec.short()} has no recorded spec")
    assert "--spec-from-overlay" in exc.value.details[0] and rec.revision in exc.value.details[0]


def test_the_recorded_spec_survives_the_history_configmap_and_a_restore(dns, manifests, overlay):
    served = load_spec(overlay)
    target, rec = _serving(dns, manifests, served)
    second = _record(manifests, variant="b").model_copy(update={"spec": None})
    target.apply(second, Lines())
    target.wait_ready(30, Lines())
    target.promote(["ok"], None, Lines())
    fresh = _target(dns)
    assert fresh.status().stable.release.spec is None
    good = next(r for r in fresh.history() if r.digest == rec.digest)
    assert good.spec == served.model_dump(mode="json")   # kept in the history: a restore carries it


def test_the_canary_history_lives_in_the_release_record_configmap_and_survives_a_retry(
        dns, manifests, overlay, tmp_path, monkeypatch):
    """pd-canary's runs on the emulator: recorded in pdops-history-<release> (canary.json) under the
    workflow's name (PDOPS_RUN_ID), once per run however often the step is retried; the next release
    starts the history again; the record's other keys survive the write."""
    import json

    from tests.unit.test_local_target import _canary_decision
    from workflows.pipeline.canary import judge_canary

    target, rec = _serving(dns, manifests, load_spec(overlay))
    for run in ("pd-canary-1764950400", "pd-canary-1764952200", "pd-canary-1764952200"):
        monkeypatch.setenv("PDOPS_RUN_ID", run)
        assert not judge_canary(target, _canary_decision(300.0), tmp_path, Lines()).act
    cm = target.kube.get("ConfigMap", f"pdops-history-{target.store.find_release()}")
    saved = json.loads(cm["data"]["canary.json"])
    assert saved["release"] == rec.digest and saved["runs_since_reset"] == 2
    assert target.status().stable.release.digest == rec.digest    # the slots were written back intact
    assert target.canary_history() == saved
