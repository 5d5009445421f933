"""The single-engine reference on the Kubernetes target (workflows/targets/kube/reference.py), on the
test cluster (tests/fakes/kube).

Emulated in every test: the API server (server-side apply, finalizers, uid delete preconditions,
label selectors), a fake KubeRay v1.7 (RayCluster, pods, `<rs>-serve-svc`, status; it keeps
deleted RayServices terminating until its finalizer goes, terminate_ticks) whose Serve
applications are OpenAI fakes on 127/8, a scheduler and the EndpointSlice controller. The engines
are tests/fakes/diff_fake.py DiffFakes: token ids a function of the request, as one model's greedy
or seeded answers are, so a correct P/D candidate and the reference agree and a planted bug shows.
Cluster DNS (`*.svc.cluster.local`) is emulated by resolving to the Service's clusterIP. What only
a real cluster shows: real Ray Serve LLM start-up of build_openai_app, model load times, GPUs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import SCHEMAS, local_overlay
from tests.fakes.diff_fake import DiffFake, Plant
from tests.kube_support import LOCAL_NS, Lines, eventually, live, record as _record, target as _target
from workflows.checks.schema import validate_objects
from workflows.pipeline import steps
from workflows.render.manifest import render
from workflows.spec.release import load_spec

REF = "pd-llm-reference"
pytestmark = pytest.mark.usefixtures("judged_after_the_reference")   # tests/unit/conftest.py says why


@pytest.fixture
def overlay(tmp_path):
    """overlays/local with the diff on and one small load (the checks under test are golden and diff)."""
    def edit(spec):
        spec["slo"]["kv_transfer"] = "ignored"
        spec["validation"].update(diff=True, scenarios=[], known_divergences=None,  # both tuned to the real stack
                                  load=[{"profile": "balanced", "concurrency": 1, "requests": 2, "warmup_requests": 0}])
    return local_overlay(tmp_path, edit)


def _candidate(cluster, manifests):
    target, rec = _target(cluster, reference_timeout_s=30), _record(manifests)
    target.apply(rec, Lines())
    target.wait_ready(30, Lines())
    return target, rec


def _validate(target, rec, overlay, tmp_path, progress):
    run = tmp_path / "run"
    run.mkdir()
    out = steps.validate_slot(target, load_spec(overlay), run, progress, digest=rec.digest,
                              rendered=render(overlay, validate_serve_config=False))
    return {c.check: c for c in out.decision.checks}, run


def _reference_writes(cluster) -> list:
    return [r for r in cluster.writes() if REF in r.path and "rayservices" in r.path]


@pytest.mark.parametrize("planted", [False, True])
def test_validate_creates_the_reference_compares_golden_tokens_and_the_diff_then_deletes_it(
        dns, manifests, overlay, tmp_path, planted):
    """Planted: the candidate's (blue) engine answers the second prompt of a completions batch with
    other tokens, as Ray's P/D orchestrator does (docs/diff.md#findings-on-the-real-stack, finding 1); the
    reference does not."""
    if planted:
        dns.kuberay.engines["blue"] = {"server": DiffFake, "plant": Plant(wrong_tokens_on_prompt=1)}
    target, rec = _candidate(dns, manifests)
    progress = Lines()
    checks, run = _validate(target, rec, overlay, tmp_path, progress)

    body = _reference_writes(dns)[0].body
    applied = body if isinstance(body, dict) else yaml.safe_load(body)
    assert applied["metadata"]["labels"]["pdops.dev/role"] == "reference"
    cluster_config = applied["spec"]["rayClusterConfig"]
    assert [(g["groupName"], g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in cluster_config["workerGroupSpecs"]] \
        == [("decode", 1, 1, 1)]
    rendered_rs = next(o for o in manifests["local"].objects if o["kind"] == "RayService")
    head = cluster_config["headGroupSpec"]
    assert head["template"]["spec"] == rendered_rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    app = yaml.safe_load(applied["spec"]["serveConfigV2"])["applications"]
    assert [a["import_path"] for a in app] == ["ray.serve.llm:build_openai_app"]
    llm = app[0]["args"]["llm_configs"]
    assert len(llm) == 1 and "kv_transfer_config" not in llm[0]["engine_kwargs"]
    assert llm[0]["deployment_config"]["num_replicas"] == 1
    assert [f for f in validate_objects([applied], Path(SCHEMAS), "emulator") if f.severity == "error"] == []

    golden = json.loads((run / "golden.json").read_text())
    assert golden["prompts"] == 4 and golden["ok"], golden   # golden prompts are single completions: spared
    assert checks["golden_tokens"].ok
    diff = json.loads((run / "diff.json").read_text())
    assert diff["summary"]["reference_url"] == f"http://{REF}-serve-svc.{LOCAL_NS}.svc.cluster.local:8000/v1"
    if planted:
        assert not checks["diff"].ok and "cmpl_batch_prompts" in checks["diff"].message
    else:
        assert checks["diff"].ok, checks["diff"].message
        assert diff["summary"]["differs"] == 0 and diff["summary"]["same"] > 100
    assert any(line.startswith(f"[reference] {REF}: RUNNING") for line in progress)
    assert f"[reference] deleted RayService/{REF}" in progress
    assert REF not in dns.objects("rayservices")              # gone, not just terminating
    assert not [p for p in dns.objects("pods").values() if p["metadata"]["labels"].get("pdops.dev/role")]


def test_a_candidate_that_already_fails_starts_no_reference_certain_rollback(dns, manifests, overlay, tmp_path):
    """Golden tokens and the diff only add checks: a candidate already rolled back on what was measured gets no
    single-engine reference (a RayService of the release's GPUs on a cluster), and both checks say why."""
    target, rec = _candidate(dns, manifests)
    progress = Lines()
    checks, _ = _validate(target, rec, overlay, tmp_path, progress)
    assert not checks["compat"].ok and not checks["error_rate"].ok       # decided by what was measured
    for name in ("golden_tokens", "diff"):
        assert checks[name].verdict == "skipped", checks[name]
        assert "a certain rollback" in checks[name].message and "compat" in checks[name].message
    assert _reference_writes(dns) == []                                  # no reference RayService, ever
    assert not any(line.startswith("[reference]") for line in progress)


def test_no_room_for_a_decode_pod_skips_both_checks_with_the_reason_and_applies_nothing(dns, manifests, overlay, tmp_path):
    """Emulated: another tenant's pod bound to the only node takes the CPU the reference would need
    (the candidate and stable hold theirs meanwhile)."""
    target, rec = _candidate(dns, manifests)
    from kubernetes import client
    from kubernetes.utils import parse_quantity
    free = 32 - sum(parse_quantity(c["resources"]["requests"]["cpu"]) for p in dns.objects("pods").values()
                    for c in p["spec"]["containers"] if (c.get("resources") or {}).get("requests", {}).get("cpu"))
    client.CoreV1Api(dns.client()).create_namespaced_pod("default", {
        "metadata": {"name": "other-tenant"}, "spec": {"nodeName": "cpu-1", "containers": [
            {"name": "x", "image": "x", "resources": {"requests": {"cpu": str(free)}}}]}})
    progress = Lines()
    checks, run = _validate(target, rec, overlay, tmp_path, progress)
    for name in ("golden_tokens", "diff"):
        assert checks[name].ok and checks[name].verdict == "skipped"
        assert "skipped: no room for one decode pod: decode pod 1/1 (cpu=" in checks[name].message
        assert "fits on no node — cpu-1: cpu=0" in checks[name].message
    assert "| golden_tokens |  | ✔ | skipped | golden tokens skipped: no room for one decode pod" in (run / "summary.md").read_text()
    assert any(line.startswith("[reference] skipped: no room for one decode pod") for line in progress)
    assert _reference_writes(dns) == [] and not (run / "diff.json").exists()


@pytest.mark.parametrize("behaviour, why", [("stuck", "not ready after 1s: DEPLOYING; pod pd-llm-reference-"),
                                             ("fail", "failed: DEPLOY_FAILED: pd-llm-reference (pending): engine failed")])
def test_a_reference_that_never_becomes_ready_is_skipped_with_why_and_deleted(dns, manifests, behaviour, why):
    """Emulated: KubeRay cannot schedule the reference's decode pod (stuck), or Serve's deploy fails."""
    target, rec = _candidate(dns, manifests)
    target.reference_timeout_s = 1
    dns.kuberay.behaviour[REF] = behaviour
    progress = Lines()
    with target.reference_server(rec, progress) as got:
        assert not isinstance(got, str) and why in got.reason, got
        assert REF in live(dns, "rayservices")
    assert REF not in dns.objects("rayservices")
    with target.reference_server(rec, progress) as again:   # the same release does not wait twice
        assert again.reason == got.reason
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == 1


def test_a_reference_left_by_a_killed_run_is_reported_and_removed_by_the_next_run(dns, manifests):
    """Emulated: the validate step's process dies inside the reference block (no finally runs)."""
    target, rec = _candidate(dns, manifests)
    killed = target.reference_server(rec, Lines())
    assert isinstance(killed.__enter__(), str)              # never exited: the run was killed here
    old_uid = dns.objects("rayservices")[REF]["metadata"]["uid"]
    leftovers = _target(dns).status().leftovers
    assert len(leftovers) == 1 and leftovers[0].startswith(f"RayService {REF} (single-engine reference")

    progress = Lines()
    with _target(dns, reference_timeout_s=30).reference_server(rec, progress) as url:
        assert isinstance(url, str)
        assert dns.objects("rayservices")[REF]["metadata"]["uid"] != old_uid
    assert progress[0].startswith(f"[reference] removing leftover reference RayService {REF} (revision aaaaaaaaaaaa")
    assert REF not in dns.objects("rayservices")
    del killed


def test_rollback_and_an_interrupt_leave_no_reference_behind(dns, manifests):
    """Emulated: Ctrl-C inside the reference block; then a killed run's leftover and `pdops rollback`."""
    target, rec = _candidate(dns, manifests)
    with pytest.raises(KeyboardInterrupt), target.reference_server(rec, Lines()):
        raise KeyboardInterrupt
    assert REF not in dns.objects("rayservices")
    killed = target.reference_server(rec, Lines())
    killed.__enter__()
    done = _target(dns).rollback(["validate killed"], None, Lines())
    assert f"removed leftover reference {REF}" in done
    assert REF not in dns.objects("rayservices") and _target(dns).status().leftovers == []
    del killed


def _history_records(cluster, digest):
    cm = cluster.objects("configmaps", LOCAL_NS)["pdops-history-pd-llm"]
    slots = json.loads(cm["data"]["slots.json"])
    return [r for r in [slots["stable"], slots["candidate"], *json.loads(cm["data"]["history.json"])]
            if r and r["digest"] == digest]


def test_golden_answers_are_cached_in_the_release_record_so_a_canary_does_not_start_the_reference(dns, manifests):
    target, rec = _candidate(dns, manifests)
    prompts = ["Prompt 0: prefill decode", "Prompt 1: cache tensor stream"]
    first = target.reference(rec, prompts, 8, Lines())
    assert [len(a["token_ids"]) for a in first] == [8, 8]
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == 1
    assert "pdops-golden-pd-llm" not in dns.objects("configmaps", LOCAL_NS)     # no free-standing cache
    (held,) = _history_records(dns, rec.digest)                                  # the candidate's record
    assert list(held["golden"].values()) == [first]

    progress = Lines()
    assert _target(dns).reference(rec, prompts, 8, progress) == first      # a fresh run: from the record
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == 1
    assert progress[0].startswith(f"[golden] reference answers cached in the release record of {rec.short()}")
    assert _target(dns).reference(rec, prompts[:1], 8, Lines()) == first[:1]   # other prompts: started again
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == 2
    eventually(lambda: REF not in dns.objects("rayservices"))
    target.promote(["ok"], None, Lines())
    assert all(len(r["golden"]) == 2 for r in _history_records(dns, rec.digest))   # promoted: kept with it


def test_a_restore_uses_the_restored_release_s_own_golden_answers_and_a_new_release_starts_fresh(dns, manifests):
    target, a = _candidate(dns, manifests)
    prompts = ["Prompt 0: prefill decode"]
    answers_a = target.reference(a, prompts, 4, Lines())
    eventually(lambda: REF not in dns.objects("rayservices"))
    target.promote(["ok"], None, Lines())
    b = _record(manifests, variant="b")
    target.apply(b, Lines())
    target.wait_ready(30, Lines())
    writes = len([r for r in _reference_writes(dns) if r.method == "PATCH"])
    target.reference(b, prompts, 4, Lines())               # a new release: none cached for it, the reference runs
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == writes + 1
    eventually(lambda: REF not in dns.objects("rayservices"))
    target.promote(["ok"], None, Lines())
    target.rollback(["canary: regressed"], None, Lines(), to_previous=True)
    restored = _target(dns).status().stable.release
    assert restored is not None and restored.digest == a.digest, restored
    progress = Lines()
    assert _target(dns).reference(restored, prompts, 4, progress) == answers_a
    assert len([r for r in _reference_writes(dns) if r.method == "PATCH"]) == writes + 1   # none started
    assert progress[0].startswith(f"[golden] reference answers cached in the release record of {a.short()}")


def test_a_golden_write_that_races_another_writer_is_retried_on_the_fresh_history(dns, manifests, monkeypatch):
    """409 on a stale resourceVersion (apiserver registry/store.go Update) -> read again, nothing lost."""
    from workflows.targets.kube import golden_cache
    from workflows.targets.kube.api import Kube

    target, rec = _candidate(dns, manifests)
    real, calls = Kube.replace, []

    def racing(self, obj):
        if not calls:   # another writer saves the history between our read and our write
            cm = self.get("ConfigMap", obj["metadata"]["name"])
            cm["data"]["history.json"] = "[]"
            real(self, {k: cm[k] for k in ("apiVersion", "kind", "metadata", "data")})
        calls.append(obj["metadata"]["resourceVersion"])
        return real(self, obj)
    monkeypatch.setattr(Kube, "replace", racing)
    done = golden_cache.save(target.store, rec, "k1", [{"token_ids": [1, 2]}])
    assert done.startswith("cached in the release record") and len(calls) == 2 and calls[0] != calls[1], calls
    (held,) = _history_records(dns, rec.digest)
    assert held["golden"] == {"k1": [{"token_ids": [1, 2]}]}


def _legacy_cluster(cluster, manifests, prompts):
    """A cluster an earlier pdops (before ReleaseRecord.golden) ran the reference on: its answers in ConfigMap
    pdops-golden-<release>, in the shape that pdops applied (one `<key>.json` per answer set)."""
    from workflows.targets.kube import golden_cache, reference as ref

    target, rec = _candidate(cluster, manifests)
    k = golden_cache.key(ref.engine_identity(ref.rayservice(rec, LOCAL_NS)), prompts, 8)
    old = [{"token_ids": [7] * 8, "text": "from the old cache"} for _ in prompts]
    target.kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "pdops-golden-pd-llm", "namespace": LOCAL_NS,
                                    "labels": {"app.kubernetes.io/part-of": "pdops", "pdops.dev/golden-of": "pd-llm"}},
                       "data": {f"{k}.json": json.dumps({"saved_at": 1.0, "answers": old}),
                                f"{'0' * 32}.json": json.dumps({"saved_at": 0.5, "answers": [{"token_ids": [1]}]})}})
    return target, rec, k, old


def test_an_old_cluster_s_pdops_golden_configmap_is_carried_into_the_record_and_removed_once(dns, manifests):
    prompts = ["Prompt 0: prefill decode", "Prompt 1: cache tensor stream"]
    _, rec, k, old = _legacy_cluster(dns, manifests, prompts)
    before, progress = len(dns.writes()), Lines()
    assert _target(dns).reference(rec, prompts, 8, progress) == old         # the upgrade starts no reference
    assert not _reference_writes(dns)
    assert "pdops-golden-pd-llm" not in dns.objects("configmaps", LOCAL_NS)
    (held,) = _history_records(dns, rec.digest)
    assert held["golden"] == {k: old}                                       # only the set asked for is kept
    assert progress[0].startswith("[golden] removed ConfigMap pdops-golden-pd-llm, the previous golden-answer "
                                  f"cache; its answers for {k[:12]} cached in the release record"), progress
    sent = [(r.method, r.path.rsplit("/", 1)[-1]) for r in dns.writes()[before:]]
    assert sent == [("PUT", "pdops-history-pd-llm"), ("DELETE", "pdops-golden-pd-llm")], sent

    before, progress = len(dns.writes()), Lines()                           # once: the next run sends nothing
    assert _target(dns).reference(rec, prompts, 8, progress) == old
    assert len(dns.writes()) == before and not any("pdops-golden" in line for line in progress), progress


def test_a_refused_removal_of_the_old_golden_configmap_is_reported_and_retried_by_the_next_run(dns, manifests):
    """A pd-release Role applied before it granted `delete` on configmaps answers 403: the validate or
    canary step goes on (nothing reads the old ConfigMap) and says how to remove it."""
    from tests.fakes.kube.server import ApiError

    prompts = ["Prompt 0: prefill decode"]
    target, rec, k, old = _legacy_cluster(dns, manifests, prompts)

    def refuse(req):
        if req.method == "DELETE" and req.path.endswith("/configmaps/pdops-golden-pd-llm"):
            raise ApiError(403, "Forbidden", 'configmaps "pdops-golden-pd-llm" is forbidden: User '
                                             '"system:serviceaccount:argo:pd-release" cannot delete resource')
    dns.faults.before_write.append(refuse)
    progress = Lines()
    assert target.reference(rec, prompts, 8, progress) == old and not _reference_writes(dns)
    assert "pdops-golden-pd-llm" in dns.objects("configmaps", LOCAL_NS)
    assert "left in place" in progress[0] and "403" in progress[0], progress
    assert progress[0].endswith(f"kubectl -n {LOCAL_NS} delete configmap pdops-golden-pd-llm"), progress

    dns.faults.before_write.remove(refuse)
    progress = Lines()
    assert _target(dns).reference(rec, prompts, 8, progress) == old
    assert "pdops-golden-pd-llm" not in dns.objects("configmaps", LOCAL_NS)
    assert progress[0] == "[golden] removed ConfigMap pdops-golden-pd-llm, the previous golden-answer cache", progress


def test_the_history_drops_golden_answers_before_records_and_never_refuses_a_release_for_them(manifests):
    """history.encode under its budget (the API server refuses a ConfigMap whose data exceed 1 MiB:
    pkg/apis/core/validation ValidateConfigMap, core.MaxSecretSize): the oldest records' golden answers
    go first, then the slots' own if they alone take half the budget, and only then whole records."""
    from workflows.targets.kube.history import BUDGET, State, decode, encode

    def big(tag):   # one answer set of ~120 KiB: under ENTRY_LIMIT, so golden_cache would keep it
        return {tag: [{"token_ids": list(range(20_000))}]}
    promoted = [_record(manifests, variant=f"v{i}").model_copy(update={"verdict": "promote", "golden": big(f"k{i}")})
                for i in range(6)]
    candidate = _record(manifests, variant="c").model_copy(update={"golden": big("kc")})
    state = State(release="pd-llm", history=promoted, stable=promoted[-1], candidate=candidate)
    data = encode(state)
    assert sum(len(v.encode()) for v in data.values()) <= BUDGET
    back = decode(data, "pd-llm")
    assert [r.digest for r in back.history] == [r.digest for r in promoted]           # every record kept
    kept = [bool(r.golden) for r in back.history]
    assert kept == sorted(kept) and not kept[0] and kept[-1], kept                     # the oldest ones' first
    assert back.stable.golden and back.candidate.golden

    heavy = {f"k{i}": [{"token_ids": list(range(20_000))}] for i in range(2)}           # ~240 KiB per slot
    state = State(release="pd-llm", history=promoted[-1:], stable=promoted[-1].model_copy(update={"golden": heavy}),
                  candidate=state.candidate.model_copy(update={"golden": heavy}))
    back = decode(encode(state), "pd-llm")                                               # not refused
    assert back.candidate.golden is None and back.stable.golden == heavy and back.history[0].golden
