"""vs_stable's baseline on the Kubernetes target (workflows/targets/kube/baseline.py), on the test
cluster (tests/fakes/kube: API server semantics, a fake KubeRay whose Serve applications are OpenAI
fakes with per-pod Ray metrics agents, Services forwarding to ready endpoints; cluster DNS emulated
by the `dns` fixture of tests/unit/conftest.py).

What is pinned: the baseline is the stable render at its own size in the colour `baseline` (so the
user-facing Service, which selects a blue/green colour, never routes to it); validation loads it
and never the user-facing Service; it is deleted on success, on failure (never ready: vs_stable
then fails closed with why) and on an exception; a killed run's leftover is reported by status and
removed by rollback and by the next run, idempotently.
"""
from __future__ import annotations

import pytest
import yaml

from tests.conftest import local_overlay
from tests.kube_support import LOCAL_NS, Lines, live, record as _record, release, target as _target
from workflows.pipeline import steps
from workflows.spec.release import load_spec
from workflows.targets.base import Baseline, Skipped

BASE = "pd-llm-baseline"


@pytest.fixture
def overlay(tmp_path):
    """overlays/local with vs_stable measured live in 2 block pairs; no reference (not under test here).

    The ratio limit is wide (20x) on purpose: the subject here is where the baseline runs and that the
    comparison is made and passes on identical fake engines, not the statistic (tests/unit/test_interleave.py
    and the judge's own tests pin that). On 4 requests of ~0.1 s TTFT, one 0.4 s stall of a loaded machine
    made the p90 ratio 5.4x and failed the old 5x limit (CI run 23, 2026-12-07)."""
    def edit(spec):
        spec["slo"].update(kv_transfer="ignored", vs_stable={"ttft_p90": 20.0, "blocks": 2})
        spec["validation"].update(diff=False, reference="none", scenarios=[], known_divergences=None,
                                  load=[{"profile": "balanced", "concurrency": 1, "requests": 4, "warmup_requests": 1,
                                         "ramp_s": 0.0}])
    return local_overlay(tmp_path, edit)


@pytest.fixture
def resolved(dns, monkeypatch):
    """Service URLs with the Service's clusterIP: the load generator resolves names with libuv's own
    resolver, which the `dns` fixture's socket patch does not reach."""
    from workflows.targets.kube import traffic

    real = traffic.endpoint

    def endpoint(kube, slot, record, lag_s):
        ep = real(kube, slot, record, lag_s)
        return ep.model_copy(update={"base_url": dns.resolve(ep.base_url)})
    monkeypatch.setattr(traffic, "endpoint", endpoint)
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)
    return dns


def stable_and_candidate(cluster, manifests):
    """Release a into blue (stable, behind the user-facing Service), then b as the green candidate."""
    target = _target(cluster, reference_timeout_s=30)
    stable = release(target, _record(manifests, variant="a"))
    candidate = target.apply(_record(manifests, variant="b"), Lines())
    target.wait_ready(30, Lines())
    return target, stable, candidate


def served(cluster, rayservice: str) -> int:
    """Requests the RayService's Serve application has answered (its engines' own record)."""
    uid = cluster.objects("rayservices", LOCAL_NS)[rayservice]["metadata"]["uid"]
    app = cluster.kuberay.clusters[uid].app
    return len(app.server.timings) if app is not None else 0


def baseline_writes(cluster) -> list:
    return [r for r in cluster.writes() if BASE in r.path and "rayservices" in r.path]


def test_validate_measures_a_baseline_of_the_stable_render_never_the_user_facing_service(
        resolved, manifests, overlay, tmp_path):
    dns = resolved
    target, stable, candidate = stable_and_candidate(dns, manifests)
    users_before = served(dns, "pd-llm-blue")
    run, progress = tmp_path / "run", Lines()
    run.mkdir()
    out = steps.validate_slot(target, load_spec(overlay), run, progress, digest=candidate.digest)

    body = baseline_writes(dns)[0].body
    applied = body if isinstance(body, dict) else yaml.safe_load(body)
    rendered = next(o for o in yaml.safe_load_all(stable.manifest) if o and o["kind"] == "RayService")
    assert applied["metadata"]["labels"]["pdops.dev/role"] == "baseline"
    assert applied["metadata"]["labels"]["pdops.dev/colour"] == "baseline"
    assert applied["metadata"]["annotations"]["pdops.dev/digest"] == stable.digest      # the stable release
    cluster_config, want = applied["spec"]["rayClusterConfig"], rendered["spec"]["rayClusterConfig"]
    assert [(g["groupName"], g.get("replicas"), g.get("minReplicas"), g.get("maxReplicas"))
            for g in cluster_config["workerGroupSpecs"]] == [
        (g["groupName"], g.get("replicas"), g.get("minReplicas"), g.get("maxReplicas"))
        for g in want["workerGroupSpecs"]]                                                # the same size
    assert applied["spec"]["serveConfigV2"] == rendered["spec"]["serveConfigV2"]
    for group in [cluster_config["headGroupSpec"], *cluster_config["workerGroupSpecs"]]:
        labels = group["template"]["metadata"]["labels"]
        assert labels["pdops.dev/colour"] == "baseline" and labels["pdops.dev/role"] == "baseline"
    service = dns.objects("services", LOCAL_NS)["pd-llm"]
    assert service["spec"]["selector"]["pdops.dev/colour"] == "blue"   # users' Service cannot select it

    (stab,) = out.stable_benches
    # the baseline's own serve Service (KubeRay's <rs>-serve-svc, at its clusterIP while it existed)
    assert [line for line in progress if line.startswith(f"[validate] baseline {stable.short()} at {stab.base_url}: "
                                                         f"RayService {BASE}")]
    assert stab.errors == 0 and out.benches[0].errors == 0
    assert stab.requests_ok == 4 and stab.interleaved.pairs == 2 and stab.interleaved.void == []
    assert served(dns, "pd-llm-blue") == users_before               # no benchmark request reached users' slot
    compared = [c for c in out.decision.checks if c.check.startswith("vs_stable")]
    assert compared and all(c.ok for c in compared), [c.message for c in compared]   # same fake engines
    assert f"[baseline] deleted RayService/{BASE}" in progress
    assert BASE not in dns.objects("rayservices", LOCAL_NS)            # gone, not just terminating
    assert not [p for p in dns.objects("pods", LOCAL_NS).values() if p["metadata"]["labels"].get("pdops.dev/role")]


def test_a_baseline_that_never_becomes_ready_is_deleted_and_vs_stable_fails_closed(
        resolved, manifests, overlay, tmp_path):
    dns = resolved
    target, _, candidate = stable_and_candidate(dns, manifests)
    target.reference_timeout_s = 1
    dns.kuberay.behaviour[BASE] = "fail"
    run = tmp_path / "run"
    run.mkdir()
    out = steps.validate_slot(target, load_spec(overlay), run, Lines(), digest=candidate.digest)
    (vs,) = [c for c in out.decision.checks if c.check == "vs_stable"]
    assert not vs.ok and f"no baseline could run: baseline RayService {BASE} failed" in vs.message
    assert out.decision.verdict == "rollback" and out.stable_benches == []
    assert BASE not in dns.objects("rayservices", LOCAL_NS)


def test_an_exception_inside_the_block_still_deletes_the_baseline(dns, manifests):
    target, stable, _ = stable_and_candidate(dns, manifests)
    with pytest.raises(KeyboardInterrupt), target.baseline_server(stable, Lines()) as got:
        assert isinstance(got, Baseline) and BASE in live(dns, "rayservices")
        raise KeyboardInterrupt
    assert BASE not in dns.objects("rayservices", LOCAL_NS)


def test_a_killed_runs_baseline_is_reported_and_removed_by_rollback_and_by_the_next_run(dns, manifests):
    """Emulated: the validate step's process dies inside the baseline block (no finally runs)."""
    target, stable, _ = stable_and_candidate(dns, manifests)
    killed = target.baseline_server(stable, Lines())
    assert isinstance(killed.__enter__(), Baseline)     # never exited: the run was killed here
    leftovers = _target(dns).status().leftovers
    assert [x for x in leftovers if x.startswith(f"RayService {BASE} (vs_stable baseline")]
    progress = Lines()
    with _target(dns, reference_timeout_s=30).baseline_server(stable, progress) as again:   # the next run
        assert isinstance(again, Baseline)
    assert progress[0].startswith(f"[baseline] removing leftover baseline RayService {BASE}")
    assert BASE not in dns.objects("rayservices", LOCAL_NS)
    killed_again = target.baseline_server(stable, Lines())
    killed_again.__enter__()
    done = _target(dns).rollback(["validate killed"], None, Lines())   # the exit handler's rollback
    assert f"removed leftover baseline {BASE}" in done
    assert BASE not in dns.objects("rayservices", LOCAL_NS) and _target(dns).remove_baselines(Lines()) == []
    del killed, killed_again


def test_dry_run_creates_no_baseline(dns, manifests):
    target, stable, _ = stable_and_candidate(dns, manifests)
    with _target(dns, dry_run=True).baseline_server(stable, Lines()) as got:
        assert isinstance(got, Skipped) and "dry run" in got.reason
    assert baseline_writes(dns) == []
