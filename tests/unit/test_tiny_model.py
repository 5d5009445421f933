"""The locally built model: right shape, special tokens can never win, cached by recipe."""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import os

    os.environ["PDOPS_HOME"] = str(tmp_path_factory.mktemp("pdops-home"))
    from workflows.spec.tiny_model import build

    yield build("unit")
    del os.environ["PDOPS_HOME"]


def test_model_files_and_config(built):
    from workflows.spec.tiny_model import RECIPE

    names = {p.name for p in built.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((built / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert config["max_position_embeddings"] == RECIPE["max_position_embeddings"]
    assert "chat_template" in json.loads((built / "tokenizer_config.json").read_text())


def test_special_token_rows_are_zero_and_rebuild_is_cached(built):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from workflows.spec.tiny_model import build

    tok = AutoTokenizer.from_pretrained(built)
    head = load_file(str(built / "model.safetensors"))["lm_head.weight"]
    assert all(float(head[i].abs().sum()) == 0.0 for i in tok.all_special_ids)
    assert float(head[len(tok) - 1].abs().sum()) > 0.0
    mtime = (built / "model.safetensors").stat().st_mtime
    assert build("unit") == built and (built / "model.safetensors").stat().st_mtime == mtime


def test_resolve_source_passes_other_sources_through():
    from workflows.spec.tiny_model import resolve_source

    assert resolve_source("s3://models/x") == "s3://models/x"
