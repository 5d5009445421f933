"""Your own traffic: traces in Mooncake, Azure and plain JSONL form, replayed on the known-timing fake.

What is real: the trace readers, the release spec, the render that resolves and checks the trace,
and the latency harness replaying it open-loop against a real HTTP server on 127.0.0.1 (the
known-timing fake, which honours max_tokens and counts prompt words as tokens).
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import local_overlay
from tests.fakes.known_timing_server import KnownTimingServer
from validation import profiles, traces
from validation.bench import BenchConfig, run_bench
from workflows.errors import InputError

MOONCAKE = [{"timestamp": 3052, "input_length": 40, "output_length": 3, "hash_ids": [0, 1]},
            {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [0]},
            {"timestamp": 0, "input_length": 30, "output_length": 2, "hash_ids": [0, 2]}]
AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.4944730,879,47\n")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mooncake_is_sorted_shifted_to_zero_in_seconds_and_scaled(tmp_path):
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in MOONCAKE) + "\n")
    trace = traces.load(path)                                  # auto-detected by input_length
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 20, 5), (0.0, 30, 2), (3.052, 40, 3)]
    fast = traces.load(path, "mooncake", time_scale=2.0, max_requests=2)
    assert fast.arrivals == [0.0, 0.0] and len(fast.requests) == 2
    assert traces.load(path, time_scale=4.0).arrivals[-1] == pytest.approx(0.763)


def test_azure_csv_and_plain_jsonl(tmp_path):
    trace = traces.load(write(tmp_path, "a.csv", AZURE))
    assert [r.prompt_tokens for r in trace.requests] == [374, 396, 879]
    assert trace.arrivals[1] == pytest.approx(4.314579, abs=1e-5) and trace.arrivals[2] == pytest.approx(4.813883, abs=1e-5)
    plain = traces.load(write(tmp_path, "p.jsonl", '{"arrival_s": 1.5, "prompt_tokens": 8, "output_tokens": 4}\n'
                                                   '{"arrival_s": 0.5, "prompt_tokens": 9, "output_tokens": 6}\n'))
    assert [(r.arrival_s, r.prompt_tokens) for r in plain.requests] == [(0.0, 9), (1.0, 8)]
    assert plain.lengths(-1) == (8, 4)    # warm-up indexes reuse the trace's lengths


@pytest.mark.parametrize("text,field", [
    ('{"timestamp": 0, "input_length": 0, "output_length": 5}\n', "line 1: input_length"),
    ('{"timestamp": -1, "input_length": 3, "output_length": 5}\n', "line 1: timestamp"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 5}\n{not json\n', "line 2"),
    ('{"timestamp": 0, "input_length": 3, "output_length": true}\n', "line 1: output_length"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "line 2: TIMESTAMP"),
    ("time,prompt\n1,2\n", "line 1"),
])
def test_a_damaged_trace_names_the_file_line_and_field(tmp_path, text, field):
    path = write(tmp_path, "bad.trace", text)
    with pytest.raises(InputError) as err:
        traces.load(path)
    assert err.value.file == str(path) and err.value.field == field


def test_replay_sends_each_request_at_its_arrival_with_its_lengths():
    """Open loop: every request is scheduled at the trace's arrival (latency is also measured from
    there), and the server sees the trace's prompt and output lengths."""
    lines = [traces.TraceRequest(a, p, o) for a, p, o in [(0.0, 12, 3), (0.0, 30, 6), (0.2, 7, 2), (0.45, 50, 4)]]
    trace = traces.Trace("t", tuple(lines))
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.002, tokens=16, model="m") as srv:
        bench = run_bench(BenchConfig(srv.base_url, "m", profiles.get("balanced"), trace=trace, endpoint="completions",
                                      keep_samples=False))
    assert bench.load.mode == "open" and bench.load.trace == "t" and bench.requests_ok == 4
    assert bench.output_tokens.max == 6 and bench.output_tokens.mean == pytest.approx(3.75)
    assert bench.lengths.checked == 4 and bench.lengths.output_mismatches == 0
    assert bench.ttft_from_scheduled_ms.mean >= bench.ttft_ms.mean - 0.5


@pytest.fixture
def overlay(tmp_path):
    return local_overlay(tmp_path)


def set_load(overlay, load):
    spec = yaml.safe_load((overlay / "release.yaml").read_text())
    spec["validation"]["load"] = [load]
    (overlay / "release.yaml").write_text(yaml.safe_dump(spec))


def test_release_yaml_trace_is_resolved_checked_and_exclusive_with_a_load(overlay):
    from workflows.render.manifest import render

    (overlay / "traces").mkdir()
    (overlay / "traces" / "ours.jsonl").write_text('{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 4}\n')
    set_load(overlay, {"profile": "balanced", "trace": "traces/ours.jsonl", "time_scale": 2, "requests": 10})
    load = render(overlay).spec.validation.load[0]
    assert load.trace == str((overlay / "traces" / "ours.jsonl").resolve()) and load.concurrency is None
    set_load(overlay, {"trace": "traces/ours.jsonl", "concurrency": 4})
    with pytest.raises(InputError, match="sets its own arrival times") as err:
        render(overlay)
    assert err.value.field.startswith("validation.load[0]")
    set_load(overlay, {"trace": "../../../etc/passwd"})
    with pytest.raises(InputError, match="outside the repository") as err:
        render(overlay)
    assert err.value.field == "validation.load[0].trace"
    set_load(overlay, {"trace": "traces/missing.jsonl"})
    with pytest.raises(InputError, match="no such file"):
        render(overlay)


def test_loadgen_schedules_each_request_at_its_arrival():
    from validation.loadgen import LoadSpec, run

    arrivals = [0.0, 0.0, 0.15, 0.4]
    with KnownTimingServer(first_token_delay=0.01, inter_token_delay=0.002, tokens=4, model="m") as srv:
        res = run(LoadSpec(srv.base_url, "m", lambda i: {"prompt": "a b c", "max_tokens": 2}, endpoint="completions",
                           concurrency=None, requests=len(arrivals), arrivals=arrivals))
    recs = sorted(res["records"], key=lambda r: r["index"])
    assert [round(r["scheduled"], 9) for r in recs] == arrivals and res["mode"] == "open"
    # never early beyond the event loop's timer resolution (libuv timers count whole milliseconds)
    assert all(r["sent"] >= r["scheduled"] - 0.0015 for r in recs), [(r["sent"], r["scheduled"]) for r in recs]
    assert recs[3]["sent"] - recs[0]["sent"] >= 0.4 - 0.0015          # the gaps of the trace are kept
