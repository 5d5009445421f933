"""`pdops diff` of a REAL vLLM CPU engine (the tiny model) against itself: no false divergence.

The whole built-in matrix, one request at a time; every case must be `same`. This is the test
that the comparison (token ids, logprobs, usage, stream vs non-stream, error shapes) has no
noise of its own on a real engine, so a divergence on the P/D stack is the stack's.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vllm_url(real_vllm):
    return real_vllm


def test_a_real_engine_diffed_against_itself_is_all_same(vllm_url, tmp_path):
    from validation.diff import matrix
    from workflows.cli.main import main

    out = tmp_path / "diff.json"
    code = main(["diff", "--base-url", vllm_url, "--reference-url", vllm_url, "--model", "pdops-tiny",
                 "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, [(c["name"], c["detail"]) for c in report["cases"] if c["outcome"] != "same"]
    assert report["summary"]["same"] == report["summary"]["cases"] == len(matrix.cases())
    answered = {c["name"] for c in report["cases"] if c["candidate"]["answer"]["status"] == 200}
    # "same" must mostly mean equal tokens, not two equal errors: the sampling, logprobs,
    # structured-output and prompt-form cases are answered by a real engine
    for name in ("chat_greedy", "cmpl_batch_prompts", "chat_logprobs", "cmpl_echo_logprobs", "chat_json_schema",
                 "chat_n2_seed", "cmpl_stop_token_ids", "chat_tool_none", "cmpl_stream_interval",
                 "chat_continuous_usage", "chat_chat_template_kwargs"):
        assert name in answered, name
    greedy = next(c for c in report["cases"] if c["name"] == "chat_greedy")["candidate"]
    assert len(greedy["answer"]["choices"][0]["token_ids"]) == matrix.MAX_TOKENS
    assert greedy["streamed"]["choices"][0]["token_ids"] == greedy["answer"]["choices"][0]["token_ids"]
