"""The check cache (workflows/render/cache.py): a hit says what a miss says, and nothing stale or broken is trusted.

Ray's own PDServingArgs decides every config the cache has not seen
(ray/llm/_internal/serve/serving_patterns/prefill_decode/builder.py); a spy on it shows when it ran.
"""
from __future__ import annotations

import copy
import json
import shutil
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT, SCHEMAS
from workflows.checks.run import check_rendered
from workflows.errors import InputError
from workflows.render import cache, manifest
from workflows.render.serve_config import build_serve_config, validate_with_ray
from workflows.spec.release import load_spec


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDOPS_NO_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def ray_calls(monkeypatch):
    """Every args dict Ray's PDServingArgs validated in this test (the real model still runs)."""
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

    calls: list[dict] = []
    real = PDServingArgs.model_validate

    def spy(args, *a, **k):
        calls.append(args)
        return real(args, *a, **k)

    monkeypatch.setattr(PDServingArgs, "model_validate", spy)
    return calls


def _config(env: str = "local") -> dict:
    return build_serve_config(load_spec(ROOT / "overlays" / env))


def _mismatched_model_ids(config: dict) -> dict:
    """Valid for our spec model, rejected by Ray: `P/D model id mismatch` (builder._validate_model_ids)."""
    bad = copy.deepcopy(config)
    bad["applications"][0]["args"]["decode_config"]["model_loading_config"]["model_id"] = "other-model"
    return bad


def _error(config: dict) -> InputError:
    with pytest.raises(InputError) as info:
        validate_with_ray(config, "release.yaml")
    return info.value


def _entries(cache_dir: Path, namespace: str) -> list[Path]:
    return sorted((cache_dir / namespace).glob("*.json"))


@pytest.mark.parametrize("env", ["local", "prod"])
def test_a_hit_gives_the_same_findings_as_a_miss(cache_dir, ray_calls, monkeypatch, env):
    overlay = ROOT / "overlays" / env
    monkeypatch.setenv("PDOPS_NO_CACHE", "1")
    uncached = manifest.render(overlay)
    uncached_findings = check_rendered(uncached, SCHEMAS)
    monkeypatch.delenv("PDOPS_NO_CACHE")
    miss = manifest.render(overlay)
    miss_findings = check_rendered(miss, SCHEMAS)
    assert len(ray_calls) == 2 and len(_entries(cache_dir, "ray-verdicts")) == 1
    assert len(_entries(cache_dir, "kustomize")) == 1
    hit = manifest.render(overlay)
    hit_findings = check_rendered(hit, SCHEMAS)
    assert len(ray_calls) == 2, "a hit must not consult Ray"
    assert hit.text() == miss.text() == uncached.text()
    assert [f.to_dict() for f in hit_findings] == [f.to_dict() for f in miss_findings] \
        == [f.to_dict() for f in uncached_findings]


def test_a_changed_serve_config_misses_and_key_order_does_not(cache_dir, ray_calls):
    config = _config()
    validate_with_ray(config, "release.yaml")
    changed = copy.deepcopy(config)
    changed["applications"][0]["args"]["prefill_config"]["engine_kwargs"]["max_num_seqs"] = 8
    validate_with_ray(changed, "release.yaml")
    assert len(ray_calls) == 2 and len(_entries(cache_dir, "ray-verdicts")) == 2
    args = config["applications"][0]["args"]
    reordered = copy.deepcopy(config)
    reordered["applications"][0]["args"] = {k: args[k] for k in reversed(list(args))}
    validate_with_ray(reordered, "release.yaml")
    assert len(ray_calls) == 2


def test_a_changed_ray_or_vllm_version_misses(cache_dir, ray_calls, monkeypatch):
    from importlib import metadata

    config = _config()
    validate_with_ray(config, "release.yaml")
    validate_with_ray(config, "release.yaml")
    assert len(ray_calls) == 1
    real = metadata.version
    for dist, calls in (("ray", 2), ("vllm", 3)):
        monkeypatch.setattr(cache.metadata, "version", lambda d, dist=dist: "99.0.0" if d == dist else real(d))
        cache.version.cache_clear()
        validate_with_ray(config, "release.yaml")
        assert len(ray_calls) == calls, f"a new {dist} version must be asked again"
    monkeypatch.undo()
    cache.version.cache_clear()


def test_an_invalid_config_is_cached_as_invalid_with_ray_s_message(cache_dir, ray_calls):
    bad = _mismatched_model_ids(_config())
    miss = _error(bad)
    hit = _error(bad)
    assert len(ray_calls) == 1
    assert "P/D model id mismatch" in miss.problem and "PDServingArgs" in miss.problem
    assert (hit.file, hit.field, hit.problem, hit.fix) == (miss.file, miss.field, miss.problem, miss.fix)
    [entry] = _entries(cache_dir, "ray-verdicts")
    assert json.loads(entry.read_text())["valid"] is False


def test_a_valid_entry_under_an_invalid_config_s_name_is_not_trusted(cache_dir, ray_calls):
    """A file renamed or copied onto another key (or a forged `valid: true`) is a miss: Ray decides."""
    good, bad = _config(), _mismatched_model_ids(_config())
    validate_with_ray(good, "release.yaml")
    [good_entry] = _entries(cache_dir, "ray-verdicts")
    _error(bad)
    [bad_entry] = [p for p in _entries(cache_dir, "ray-verdicts") if p != good_entry]
    shutil.copyfile(good_entry, bad_entry)
    assert "P/D model id mismatch" in _error(bad).problem
    assert len(ray_calls) == 3
    entry = json.loads(bad_entry.read_text())
    assert entry["valid"] is False and entry["key"] == bad_entry.stem   # rewritten by the miss


@pytest.mark.parametrize("damage", [b"", b"{", b"\xff\xfe garbage", b"[]", b'{"valid": true}',
                                    b'{"key": 1, "valid": "yes"}', b"null"])
def test_a_corrupted_cache_file_is_ignored(cache_dir, ray_calls, damage):
    bad = _mismatched_model_ids(_config())
    _error(bad)
    [entry] = _entries(cache_dir, "ray-verdicts")
    entry.write_bytes(damage)
    assert "P/D model id mismatch" in _error(bad).problem
    assert len(ray_calls) == 2
    assert json.loads(entry.read_text())["valid"] is False


def test_other_exceptions_from_ray_are_not_cached(cache_dir, monkeypatch):
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

    def broken(args, *a, **k):
        raise OSError("disk went away")

    monkeypatch.setattr(PDServingArgs, "model_validate", broken)
    assert "disk went away" in _error(_config()).problem
    assert _entries(cache_dir, "ray-verdicts") == []


@pytest.mark.parametrize("value", [float("nan"), {1: "integer key"}, ("a", "tuple"), __import__("datetime").date(2026, 1, 1)])
def test_values_json_would_change_are_not_cached(value):
    """JSON would make them look like another value (NaN, "1", a list, a string) that Ray may judge differently."""
    assert cache.digest({"x": value}) is None
    assert cache.digest({"x": "plain"}) is not None


def test_unwritable_cache_only_costs_speed(tmp_path, monkeypatch, ray_calls):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("PDOPS_CACHE_DIR", str(tmp_path / "file" / "cache"))
    config = _config()
    validate_with_ray(config, "release.yaml")
    validate_with_ray(config, "release.yaml")
    assert len(ray_calls) == 2


def test_concurrent_writers_never_leave_a_partial_entry(cache_dir):
    """Writers of one key race a reader: every read is a miss or a whole entry (rename is atomic)."""
    class Blob(cache.Entry):
        data: str

    key = "k" * 64
    seen, stop = [], threading.Event()

    def writer(n: int) -> None:
        for i in range(150):
            cache.write("race", Blob(key=key, data=str(n) * (1000 + 97 * i)))

    def reader() -> None:
        while not stop.is_set():
            seen.append(cache.read("race", key, Blob))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    whole = [b for b in seen if b is not None]
    assert whole and all(len(set(b.data)) == 1 and len(b.data) >= 1000 for b in whole)
    assert list((cache_dir / "race").iterdir()) == [cache_dir / "race" / f"{key}.json"]   # no temp files left


def test_kustomize_output_misses_when_a_file_it_reads_changes(cache_dir, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "kustomize", repo / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", repo / "overlays" / "local")
    overlay = repo / "overlays" / "local"
    runs = []
    real_run = manifest.subprocess.run
    monkeypatch.setattr(manifest.subprocess, "run", lambda *a, **k: runs.append(a) or real_run(*a, **k))
    first = manifest.kustomize_build(overlay)
    assert manifest.kustomize_build(overlay) == first and len(runs) == 1
    service = repo / "kustomize" / "base" / "service.yaml"   # a resource file, not a kustomization
    service.write_text(service.read_text().replace("port: 8000", "port: 8123"))
    changed = manifest.kustomize_build(overlay)
    assert len(runs) == 2
    assert manifest.find(changed, "Service")[0]["spec"]["ports"][0]["port"] == 8123


def test_crd_schema_cache_hit_equals_miss_and_a_changed_crd_misses(cache_dir, tmp_path):
    from workflows.checks.schema import _crd_schema

    crd = next(SCHEMAS.glob("kuberay-*/ray.io_rayservices.yaml"))
    copy_ = tmp_path / crd.name
    shutil.copyfile(crd, copy_)
    miss = _crd_schema(copy_, "v1")
    assert len(_entries(cache_dir, "crd-schemas")) == 1
    assert _crd_schema(copy_, "v1") == miss and miss is not None
    copy_.write_text(copy_.read_text().replace("serveConfigV2:", "serveConfigV3:", 1))
    changed = _crd_schema(copy_, "v1")
    assert len(_entries(cache_dir, "crd-schemas")) == 2
    assert "serveConfigV3" in changed["properties"]["spec"]["properties"]
