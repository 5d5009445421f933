"""`pdops diff` against deterministic fake engines (tests/fakes/diff_fake.py) on 127.0.0.1.

Two instances of the same fake answer every body alike (no false divergence); a `Plant` makes the
candidate diverge in one way at a time, and the suite must name exactly the cases it breaks.
"""
from __future__ import annotations

import json
import time

import pytest

from tests.fakes.diff_fake import DiffFake, Plant
from validation.diff import matrix, runner
from validation.diff.command import diff
from workflows.cli.main import main

MODEL = "fake-model"


@pytest.fixture(scope="module")
def reference():
    with DiffFake(model=MODEL) as srv:
        yield srv


def _run(candidate_url: str, reference_url: str, *extra: str, tmp_path) -> tuple[int, dict]:
    out = tmp_path / "diff.json"
    code = main(["diff", "--base-url", candidate_url, "--reference-url", reference_url, "--model", MODEL,
                 "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def _outcomes(report: dict) -> dict[str, str]:
    return {c["name"]: c["outcome"] for c in report["cases"]}


def test_reference_against_itself_is_all_same(reference, tmp_path):
    code, report = _run(reference.base_url, reference.base_url, tmp_path=tmp_path)
    assert code == 0, [c for c in report["cases"] if c["outcome"] != "same"]
    assert set(_outcomes(report).values()) == {"same"}
    assert report["summary"]["cases"] == len(matrix.cases()) and report["summary"]["ok"] is True
    first = report["cases"][0]   # the CLI contract's shape, with the exact body sent
    assert {"name", "api", "request", "outcome", "candidate", "reference", "detail"} <= first.keys()
    assert first["request"]["model"] == MODEL and first["api"] in ("chat", "completions")
    # every case that expects a 200 really got one, so "same" compared tokens, not two errors
    greedy = next(c for c in report["cases"] if c["name"] == "cmpl_greedy")
    assert greedy["candidate"]["answer"]["choices"][0]["token_ids"]
    assert greedy["candidate"]["streamed"]["choices"][0]["token_ids"] == \
        greedy["candidate"]["answer"]["choices"][0]["token_ids"]


def test_two_runs_of_the_same_engine_do_not_diverge(reference, tmp_path):
    with DiffFake(model=MODEL) as other:
        report = diff(other.base_url, reference.base_url, MODEL, progress=lambda _: None)
    assert report.summary.ok and report.summary.differs == 0


def test_wrong_tokens_on_the_second_prompt_of_a_batch(reference, tmp_path):
    with DiffFake(model=MODEL, plant=Plant(wrong_tokens_on_prompt=1)) as cand:
        code, report = _run(cand.base_url, reference.base_url, tmp_path=tmp_path)
    assert code == 1
    bad = {n for n, o in _outcomes(report).items() if o != "same"}
    assert bad == {"cmpl_batch_prompts", "cmpl_batch_token_prompts"}
    case = next(c for c in report["cases"] if c["name"] == "cmpl_batch_prompts")
    assert "choice 1: token ids differ from position 0" in case["detail"]
    assert "choice 0" not in case["detail"]          # the first prompt of the batch is right
    assert case["candidate"]["answer"]["status"] == 200   # a wrong answer with HTTP 200


def test_a_500_on_one_parameter(reference, tmp_path):
    with DiffFake(model=MODEL, plant=Plant(status_500_on="logit_bias")) as cand:
        code, report = _run(cand.base_url, reference.base_url, tmp_path=tmp_path)
    assert code == 1
    bad = {n: c["detail"] for c in report["cases"] if c["outcome"] != "same" for n in [c["name"]]}
    assert set(bad) == {"chat_logit_bias", "cmpl_logit_bias", "chat_special_tokens_out", "cmpl_special_tokens_out"}
    assert bad["chat_logit_bias"].startswith("status 500 vs reference 200")


def test_a_dropped_field(reference, tmp_path):
    with DiffFake(model=MODEL, plant=Plant(drop_field="logprobs")) as cand:
        code, report = _run(cand.base_url, reference.base_url, tmp_path=tmp_path)
    assert code == 1
    bad = {c["name"]: c["detail"] for c in report["cases"] if c["outcome"] != "same"}
    asked = {c.name for c in matrix.cases() if c.body.get("logprobs") not in (None, False)}
    assert set(bad) == asked and len(asked) >= 6
    assert "logprobs missing (present on the reference)" in bad["chat_logprobs"]


def test_stream_that_disagrees_with_its_own_non_stream_answer(reference, tmp_path):
    with DiffFake(model=MODEL, plant=Plant(stream_tokens_short=True)) as cand:
        report = diff(cand.base_url, reference.base_url, MODEL, progress=lambda _: None)
    greedy = next(c for c in report.cases if c.name == "chat_greedy")
    assert greedy.outcome == "differs"
    assert "candidate stream vs non-stream: choice 0: token ids differ from position 7" in greedy.detail


def test_known_divergences_do_not_block_and_stale_ones_are_reported(reference, tmp_path):
    known = tmp_path / "known.yaml"
    known.write_text(
        "divergences:\n"
        "  - {case: chat_logit_bias, match: 'status 500', reason: planted, link: 'https://example.invalid/1'}\n"
        "  - {case: cmpl_logit_bias, reason: planted, link: 'https://example.invalid/2'}\n"
        "  - {case: chat_special_tokens_out, reason: planted, link: 'https://example.invalid/3'}\n"
        "  - {case: cmpl_special_tokens_out, reason: planted, link: 'https://example.invalid/4'}\n"
        "  - {case: chat_greedy, reason: fixed upstream, link: 'https://example.invalid/5'}\n"
        "  - {case: no_such_case, reason: typo, link: 'https://example.invalid/6'}\n")
    with DiffFake(model=MODEL, plant=Plant(status_500_on="logit_bias")) as cand:
        code, report = _run(cand.base_url, reference.base_url, "--known", str(known), tmp_path=tmp_path)
        assert code == 0
        assert report["summary"]["known"] == 4 and report["summary"]["differs"] == 0
        assert report["summary"]["known_not_reproduced"] == ["chat_greedy"]
        assert report["summary"]["known_unused"] == ["no_such_case"]
        entry = next(c for c in report["cases"] if c["name"] == "chat_logit_bias")["known"]
        assert entry["link"] == "https://example.invalid/1"
        # a known entry whose `match` does not fit is still a new divergence
        known.write_text("divergences:\n  - {case: chat_logit_bias, match: 'status 404', reason: r, link: l}\n")
        code, report = _run(cand.base_url, reference.base_url, "--known", str(known), tmp_path=tmp_path)
        assert code == 1 and _outcomes(report)["chat_logit_bias"] == "differs"


def test_scenarios_run_differentially_and_expect_is_checked_on_the_candidate(reference, tmp_path):
    f = tmp_path / "team.jsonl"
    f.write_text(
        json.dumps({"name": "ok", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "temperature": 0, "expect": {"status": 200, "body_schema": {"required": ["usage"]}}}) + "\n\n"
        + json.dumps({"name": "wants-json", "prompt": "x", "max_tokens": 4, "temperature": 0,
                      "expect": {"output_schema": {"type": "object"}}}) + "\n")
    code, report = _run(reference.base_url, reference.base_url, "--scenarios", str(f), "--no-matrix",
                        tmp_path=tmp_path)
    assert code == 1
    assert _outcomes(report) == {"scenario:ok": "same", "scenario:wants-json": "differs"}
    wants = report["cases"][1]
    assert wants["api"] == "completions" and "expect" not in wants["request"] and "name" not in wants["request"]
    assert "choice 0: output is not JSON" in wants["detail"]


@pytest.mark.parametrize("line, field, problem", [
    ("{not json", "line 1", "invalid JSON"),
    ('{"prompt": "x", "messages": []}', "line 1", "exactly one of"),
    ('{"prompt": "x", "expect": {"status": 99}}', "line 1: expect.status", "greater than or equal to 100"),
    ('{"prompt": "x", "expect": {"output_schema": {"type": 5}}}', "line 1: expect.output_schema", "not a valid JSON schema"),
])
def test_a_bad_scenarios_file_is_bad_input_naming_file_and_line(reference, tmp_path, capsys, line, field, problem):
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    code = main(["diff", "--base-url", reference.base_url, "--reference-url", reference.base_url, "--model", MODEL,
                 "--scenarios", str(f)])
    err = capsys.readouterr().err
    assert code == 2 and f"{f}: {field}" in err and problem in err


def test_a_bad_known_file_is_bad_input(reference, tmp_path, capsys):
    f = tmp_path / "known.yaml"
    f.write_text("divergences:\n  - {case: chat_greedy, reason: no link}\n")
    code = main(["diff", "--base-url", reference.base_url, "--reference-url", reference.base_url, "--model", MODEL,
                 "--known", str(f)])
    assert code == 2 and "divergences.0.link" in capsys.readouterr().err


def test_an_unreachable_reference_is_an_error_not_a_divergence(reference, tmp_path):
    report = diff(reference.base_url, "http://127.0.0.1:9/v1", MODEL, progress=lambda _: None, builtin=False,
                  scenario_files=[_one_scenario(tmp_path)])
    assert [c.outcome for c in report.cases] == ["error"] and not report.summary.ok


def _one_scenario(tmp_path) -> str:
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps({"prompt": "x", "max_tokens": 2}) + "\n")
    return str(f)


# ---- coverage: every field of the installed schemas has a case or a reason ---------------------

def test_every_request_field_of_the_installed_packages_has_a_case_or_a_reason():
    fields = matrix.schema_fields()
    assert "vllm" in fields["chat"] and "vllm" in fields["completions"]   # derived from vLLM too
    cov = matrix.coverage(fields)
    for api in ("chat", "completions"):
        assert cov[api]["unexplained"] == [], f"{api}: give these a case or a reason in matrix.UNCOVERED"
        assert cov[api]["stale"] == [], f"{api}: these are in no installed schema any more"
    assert "logit_bias" in cov["chat"]["covered"] and "ec_transfer_params" in cov["completions"]["uncovered"]


def test_a_field_new_in_an_upgraded_package_fails_the_coverage_check():
    fields = matrix.schema_fields()
    fields["chat"]["vllm"] = fields["chat"]["vllm"] | {"brand_new_knob"}
    assert matrix.coverage(fields)["chat"]["unexplained"] == ["brand_new_knob"]


def test_the_api_key_reaches_both_sides_and_no_output(tmp_path, capsys, monkeypatch):
    key = "sk-canary-diff-0123456789"
    monkeypatch.setenv("PDOPS_TEST_KEY", key)
    with DiffFake(model=MODEL, api_key=key) as srv:
        code, report = _run(srv.base_url, srv.base_url, "--api-key-env", "PDOPS_TEST_KEY", "--no-matrix",
                            "--scenarios", _one_scenario(tmp_path), tmp_path=tmp_path)
    out = capsys.readouterr()
    assert code == 0 and report["cases"][0]["candidate"]["answer"]["status"] == 200   # the key was sent
    assert key not in json.dumps(report) + out.out + out.err


class _Engine:
    """An HTTP engine that answers after `delay_s` and records how many requests it held at once."""

    def __init__(self, delay_s: float) -> None:
        import http.server
        import threading

        engine = self
        self.delay_s, self.inflight, self.peak, self.spans = delay_s, 0, 0, []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with engine.lock:
                    engine.inflight += 1
                    engine.peak = max(engine.peak, engine.inflight)
                    start = time.monotonic()
                time.sleep(engine.delay_s)
                with engine.lock:
                    engine.inflight -= 1
                    engine.spans.append((start, time.monotonic()))
                body = json.dumps({"id": "x", "object": "text_completion", "model": MODEL, "choices": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_two_sides_of_a_case_go_together_but_each_engine_holds_one_request_at_a_time():
    """runner.Sender: the candidate's and the reference's request of a case in flight together (two engines),
    never two on one engine (a batch of two may change a greedy token); an engine diffed against itself gets
    its requests strictly one after the other."""
    cases = [c for c in matrix.cases() if c.also_stream][:6]
    cand, ref = _Engine(0.1), _Engine(0.1)
    try:
        runner.run(cases, cand.base_url, ref.base_url, MODEL)
        assert (cand.peak, ref.peak) == (1, 1)
        assert len(cand.spans) == len(ref.spans) == 2 * len(cases)
        overlapping = sum(1 for a0, a1 in cand.spans for b0, b1 in ref.spans if a0 < b1 and b0 < a1)
        assert overlapping >= 2 * len(cases), overlapping   # each pair was in flight at once
        # No wall-time bound on this run: the spans above show each pair in flight at once, which is the
        # claim; a bound of 1.8 s on a 1.2 s run would fail on a loaded machine and prove nothing more.

        started = time.monotonic()
        runner.run(cases, cand.base_url, cand.base_url, MODEL)
        alone = time.monotonic() - started
        assert cand.peak == 1 and len(cand.spans) == 2 * len(cases) + 4 * len(cases)
        assert alone >= 4 * len(cases) * 0.1, alone
    finally:
        cand.close()
        ref.close()
