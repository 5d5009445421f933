"""`pdops advise` (workflows/pipeline/advise.py, advise_patch.py) from benchmark runs made against the
known-timing fake queueing on one side: the patch it offers applies with `git apply` to a copy of
the repository's overlays and `pdops check` passes on the result; bad --bench files and an overlay
that fails its checks get clear answers and no patch."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_balance import CASES, bench
from workflows.cli.main import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One bench JSON per verdict, as `pdops bench --json` / a release run writes them."""
    folder = tmp_path_factory.mktemp("runs")
    out = {}
    for verdict, (pd, prof) in CASES.items():
        out[verdict] = folder / f"{verdict}.json"
        bench(pd, prof).write(out[verdict])
    return out


@pytest.fixture
def repo(tmp_path):
    for part in ("kustomize", "overlays"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def advise(capsys, overlay, *benches, out=None):
    rc = main(["advise", str(overlay), "--bench", *map(str, benches), *(["--out", str(out)] if out else [])])
    got = capsys.readouterr()
    return rc, got.out + got.err


def apply_and_check(repo, patch):
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    return main(["check", str(repo / "overlays" / "dev")])


def test_prefill_bound_run_on_dev_grows_prefill_and_its_node_group(capsys, runs, repo, tmp_path):
    patch = tmp_path / "advice.patch"
    rc, text = advise(capsys, repo / "overlays" / "dev", runs["prefill-bound"], out=patch)
    assert rc == 0, text
    assert "release.yaml prefill.replicas: 2 -> " in text and "pdops check passes" in text
    changed = [ln for ln in patch.read_text().splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert changed and not any("decode" in ln for ln in changed)   # only the side that queued changes
    assert apply_and_check(repo, patch) == 0
    spec = yaml.safe_load((repo / "overlays/dev/release.yaml").read_text())
    suggested = json.loads(runs["prefill-bound"].read_text())["balance"]["suggestion"]["replicas"]
    assert spec["prefill"]["replicas"] == 2 * suggested   # dev has 2 engines; the run had 1
    group = next(g for g in yaml.safe_load((repo / "overlays/dev/node-groups.yaml").read_text())["spec"]
                 ["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "prefill")
    # TP 1 on 4-GPU pods: 4 replicas per pod, and replicas/min/max set together (rule replicas-ignored)
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == -(-spec["prefill"]["replicas"] // 4)
    assert "# Both phases in one availability zone" in (repo / "overlays/dev/node-groups.yaml").read_text()


def test_decode_bound_run_on_prod_raises_the_autoscaling_bound(capsys, runs, repo, tmp_path):
    patch = tmp_path / "advice.patch"
    rc, text = advise(capsys, repo / "overlays" / "prod", runs["decode-bound"], out=patch)
    assert rc == 0, text
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    assert main(["check", str(repo / "overlays" / "prod")]) == 0
    decode = yaml.safe_load((repo / "overlays/prod/release.yaml").read_text())["decode"]
    assert decode["autoscaling"]["max_replicas"] > 2 and decode["tensor_parallel_size"] == 8


def test_the_local_overlay_gets_a_node_groups_patch_of_its_own(capsys, runs, repo, tmp_path):
    patch = tmp_path / "advice.patch"
    rc, text = advise(capsys, repo / "overlays" / "local", runs["prefill-bound"], out=patch)
    assert rc == 0, text
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    assert main(["check", str(repo / "overlays" / "local")]) == 0
    rendered = subprocess.run([sys.executable, "-m", "workflows.cli.main", "render",
                               str(repo / "overlays" / "local")], capture_output=True, text=True, cwd=ROOT)
    rs = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d.get("kind") == "RayService")
    pre = next(g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "prefill")
    replicas = yaml.safe_load((repo / "overlays/local/release.yaml").read_text())["prefill"]["replicas"]
    assert pre["maxReplicas"] == replicas     # one prefill_node per CPU pod: a pod per engine


def test_runs_bound_on_both_sides_grow_both_in_one_new_node_groups_patch(capsys, runs, repo, tmp_path):
    patch = tmp_path / "advice.patch"
    rc, text = advise(capsys, repo / "overlays" / "local", runs["prefill-bound"], runs["decode-bound"], out=patch)
    assert rc == 0, text
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    assert main(["check", str(repo / "overlays" / "local")]) == 0
    groups = yaml.safe_load((repo / "overlays/local/node-groups.yaml").read_text())["spec"]["rayClusterConfig"]
    spec = yaml.safe_load((repo / "overlays/local/release.yaml").read_text())
    assert {g["groupName"]: g["maxReplicas"] for g in groups["workerGroupSpecs"]} == {
        "prefill": spec["prefill"]["replicas"], "decode": spec["decode"]["replicas"]}


def test_balanced_runs_change_nothing(capsys, runs, repo, tmp_path):
    rc, text = advise(capsys, repo / "overlays" / "dev", runs["balanced"], out=tmp_path / "p")
    assert rc == 0 and "nothing to change" in text and not (tmp_path / "p").exists()


def test_a_patch_that_fails_check_is_not_offered(capsys, runs, repo, tmp_path):
    kfile = repo / "overlays/dev/kustomization.yaml"
    kfile.write_text(kfile.read_text().replace("newTag: 2.60.0-py311-cu128", "newTag: latest"))
    rc, text = advise(capsys, repo / "overlays" / "dev", runs["prefill-bound"], out=tmp_path / "p")
    assert rc == 1 and "patch NOT offered" in text and "image-pinned" in text
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("content, says", [
    ("not json", "cannot read the bench JSON"),
    (json.dumps({"wall_s": 1.0, "ttft_ms": {}}), "balance: the run has no phase-balance figures"),
    (json.dumps([1, 2]), "wall_s: not a benchmark result"),
    (json.dumps({"wall_s": 1.0, "balance": {"verdict": "sideways"}}), "balance.verdict"),
])
def test_a_bad_bench_file_is_named_with_what_to_do(capsys, repo, tmp_path, content, says):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    rc, text = advise(capsys, repo / "overlays" / "dev", bad)
    assert rc == 2 and str(bad) in text and says in text and "fix:" in text


def test_a_missing_bench_file_is_named(capsys, repo, tmp_path):
    rc, text = advise(capsys, repo / "overlays" / "dev", tmp_path / "nope.json")
    assert rc == 2 and "nope.json" in text and "cannot read the bench JSON" in text


def test_autoscaling_that_had_room_gets_a_higher_floor(capsys, repo, tmp_path):
    """prod decode autoscales 1..2; a run that queued on decode and wants 2 engines: the maximum
    already allowed them, so the floor rises (the autoscaler did not scale in time)."""
    from validation.balance import judge

    base = {"engines": 1, "window_s": 30.0, "gauge_samples": 10}
    bal = judge({"prefill": {**base, "phase": "prefill", "waiting_mean": 0.0, "running_mean": 2.0},
                 "decode": {**base, "phase": "decode", "waiting_mean": 5.0, "running_mean": 10.0}})
    assert bal.verdict == "decode-bound" and bal.suggestion.replicas == 2
    run_file = tmp_path / "bench.json"
    run_file.write_text(json.dumps({"wall_s": 30.0, "balance": bal.model_dump(mode="json")}))
    patch = tmp_path / "advice.patch"
    rc, text = advise(capsys, repo / "overlays" / "prod", run_file, out=patch)
    assert rc == 0 and "min/max_replicas: 1/2 -> 2/2" in text, text
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    decode = yaml.safe_load((repo / "overlays/prod/release.yaml").read_text())["decode"]["autoscaling"]
    assert (decode["min_replicas"], decode["max_replicas"]) == (2, 2)
    assert main(["check", str(repo / "overlays" / "prod")]) == 0
