"""Exact prompt lengths from the served model's tokenizer (the project's tiny model)."""
from __future__ import annotations

import json
import random

import pytest

from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles
from validation.cli import main
from workflows.spec import tiny_model


@pytest.fixture(scope="module")
def model_dir():
    return tiny_model.build()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_prompts_hit_lengths_exactly(model_dir, endpoint):
    tok = profiles.Tokenizer(model_dir, endpoint)
    rng = random.Random(1)
    for n in (20, 21, 64, 255, 1024, 1100):
        assert tok.count(tok.prompt(n, rng)) == n


def test_chat_length_counts_the_template(model_dir):
    chat, plain = profiles.Tokenizer(model_dir, "chat"), profiles.Tokenizer(model_dir, "completions")
    text = "time year way"
    assert chat.count(text) > plain.count(text) == 3
    assert chat.count(chat.prompt(1, random.Random(0))) == chat.count("time")   # below the template: one word


def test_request_factory_with_and_without_tokenizer(model_dir):
    prof = profiles.get("balanced")
    tok = profiles.Tokenizer(model_dir, "chat")
    for i in range(3):
        req = profiles.request_factory(prof, 0, "chat", tok)(i)
        assert tok.count(req["messages"][0]["content"]) == req["_prompt_tokens"]
        heur = profiles.request_factory(prof, 0, "chat")(i)
        assert len(heur["messages"][0]["content"].split()) == heur["_prompt_tokens"]
        # the heuristic's one word per token undercounts this vocabulary
        assert tok.count(heur["messages"][0]["content"]) > heur["_prompt_tokens"]


def test_cli_bench_tokenizer_reports_source_and_ratio(model_dir, tmp_path, capsys):
    with KnownTimingServer(first_token_delay=0.005, inter_token_delay=0.001, tokens=4) as s:
        rc = main(["bench", "--base-url", s.base_url, "--model", "fake-model", "--prompt-tokens", "64",
                   "--output-tokens", "4", "--concurrency", "2", "--requests", "4", "--endpoint", "completions",
                   "--tokenizer", str(model_dir), "--json", str(tmp_path / "b.json")])
    assert rc == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["lengths"]["prompts_from"] == f"tokenizer {model_dir}"
    # the fake counts words: each is one token, but the first (no space before it) may take two
    assert b["lengths"]["prompt_ratio_mean"] == pytest.approx(1.0, abs=0.02)
    assert "prompt tokens served/requested 1.00x" in capsys.readouterr().out
