"""The compatibility suite passes the good fake and catches each broken switch."""
from __future__ import annotations

import pytest

from tests.fakes.known_timing_server import Broken, KnownTimingServer
from validation import compat

FAST = dict(first_token_delay=0.002, inter_token_delay=0.0005, tokens=16)


def _run(**kw):
    api_key = kw.pop("client_key", None)
    required = kw.pop("api_key_required", False)
    optional = kw.pop("optional", [])
    only = kw.pop("only", None)
    with KnownTimingServer(**FAST, **kw) as s:
        return compat.run(s.base_url, "fake-model", api_key=api_key, api_key_required=required,
                          optional=optional, only=only)


def test_good_server_passes_everything():
    r = _run()
    assert r.ok, compat.table(r)
    assert r.failed == 0
    assert {c.name for c in r.cases if c.status == "skip"} == {"auth_401"}
    stop = next(c for c in r.cases if c.name == "stop_string")
    assert "baseline" in stop.evidence["response"]


@pytest.mark.parametrize("switch,expected", [
    ("missing_usage", {"stream_include_usage", "chat_nonstream_shape"}),
    ("missing_done", {"stream_done"}),
    ("wrong_finish_reason", {"finish_reason_length", "chat_nonstream_shape"}),
    ("error_500", {"bad_negative_max_tokens", "bad_max_tokens_over_context", "bad_json_body"}),
    ("inconsistent_usage", {"chat_nonstream_shape", "stream_include_usage"}),
])
def test_broken_switch_is_caught(switch, expected):
    r = _run(broken=Broken(**{switch: True}))
    assert not r.ok
    assert expected <= set(r.required_failures), compat.table(r)
    assert "models_list" not in r.required_failures


def test_optional_failure_does_not_block():
    r = _run(broken=Broken(missing_done=True), optional=["stream_done"])
    assert r.ok and r.failed == 1


def test_auth_required():
    r = _run(api_key="sekret", client_key="sekret", api_key_required=True)
    auth = next(c for c in r.cases if c.name == "auth_401")
    assert auth.status == "pass" and r.ok


def test_auth_not_enforced_is_caught():
    r = _run(client_key="anything", api_key_required=True)
    assert "auth_401" in r.required_failures


def test_table_lists_every_case():
    r = _run()
    t = compat.table(r)
    for name in compat.CASES:
        assert name in t


def test_no_log_line_per_request_when_the_root_logger_is_at_info(caplog):
    """Ray Serve LLM's import sets the root logger to INFO (measured); the SDK's HTTP client then
    logged one line per request and buried the release's progress output."""
    import logging

    logging.getLogger().setLevel(logging.INFO)
    with caplog.at_level(logging.INFO):
        _run(only=["chat_nonstream_shape", "completions_stream_shape"])
    assert [r.getMessage() for r in caplog.records if "HTTP Request" in r.getMessage()] == []
