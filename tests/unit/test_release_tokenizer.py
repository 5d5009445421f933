"""The release's benchmark uses the served model's tokenizer whenever the target knows it.

Before: prompts of one word per requested token, which the tiny model's tokenizer splits into about
twice as many (a local release reported "prompt tokens served/requested 2.07"). The fake counts
prompt tokens the way vLLM does when given the tokenizer, so the ratio is the server's own.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.fakes.known_timing_server import KnownTimingServer
from tests.unit import test_release_flow
from tests.unit.test_release_flow import RecordingTarget, run
from workflows.pipeline.steps import record_of
from workflows.render.manifest import render
from workflows.spec import tiny_model
from workflows.targets.base import Endpoint
from workflows.targets.local import served_tokenizer

overlay = test_release_flow.overlay   # its fixture, as a name of this module (imported, the arguments shadowed it: F811)


@pytest.fixture(scope="module")
def model_dir():
    return str(tiny_model.build())


@pytest.fixture(scope="module")
def server(model_dir):
    with KnownTimingServer(first_token_delay=0.02, inter_token_delay=0.005, tokens=8, model="pdops-tiny",
                           tokenizer=model_dir) as srv:
        yield srv


def prompt_ratio(overlay, endpoint, tmp_path, monkeypatch) -> float:
    monkeypatch.setattr("validation.loadgen.LAG_P99_LIMIT_MS", 10_000.0)   # about lengths, not client health
    out, folder = run(overlay, RecordingTarget(endpoint), tmp_path)
    bench = json.loads(next(folder.glob("bench-0-*.json")).read_text())
    assert bench["requests_ok"] == 4, out
    return bench["lengths"]["prompt_ratio_mean"], bench["lengths"]["prompts_from"]


def test_release_bench_with_the_served_tokenizer_sends_the_requested_prompt_length(
        server, model_dir, overlay, tmp_path, monkeypatch):
    ratio, source = prompt_ratio(overlay, Endpoint(base_url=server.base_url, tokenizer=model_dir), tmp_path, monkeypatch)
    assert source == f"tokenizer {model_dir}"
    assert ratio == pytest.approx(1.0, abs=0.02)


def test_without_a_tokenizer_the_prompts_come_out_about_twice_as_long(server, overlay, tmp_path, monkeypatch):
    ratio, source = prompt_ratio(overlay, Endpoint(base_url=server.base_url), tmp_path, monkeypatch)
    assert source.startswith("one word per token") and ratio > 1.5


def test_local_target_knows_the_tiny_model_s_tokenizer_once_built(model_dir, tmp_path, monkeypatch):
    record = record_of(render(ROOT / "overlays" / "local"), "test")
    assert served_tokenizer(record) == model_dir
    monkeypatch.setenv("PDOPS_HOME", str(tmp_path / "empty-home"))   # not built there: nothing is built
    assert served_tokenizer(record) is None and not (tmp_path / "empty-home").exists()


def test_a_hub_model_has_no_local_tokenizer():
    record = record_of(render(ROOT / "overlays" / "prod"), "test")
    assert served_tokenizer(record) is None
