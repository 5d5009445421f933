"""Histogram and counter diffs on canned Prometheus text."""
from __future__ import annotations

import pytest

from validation import server_metrics as sm

BEFORE = """# HELP vllm:time_to_first_token_seconds ttft
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4
vllm:time_to_first_token_seconds_bucket{le="0.2",model_name="m"} 4
vllm:time_to_first_token_seconds_bucket{le="0.4",model_name="m"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.2
vllm:time_to_first_token_seconds_count{model_name="m"} 4
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{source="local_compute"} 50
vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 1000
# TYPE nixl_num_failed_transfers_total counter
nixl_num_failed_transfers_total 1
"""

AFTER = """# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4
vllm:time_to_first_token_seconds_bucket{le="0.2",model_name="m"} 9
vllm:time_to_first_token_seconds_bucket{le="0.4",model_name="m"} 14
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 14
vllm:time_to_first_token_seconds_sum{model_name="m"} 2.7
vllm:time_to_first_token_seconds_count{model_name="m"} 14
vllm:prompt_tokens_by_source_total{source="local_compute"} 80
vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 3500
nixl_num_failed_transfers_total 1
"""

RAY = """ray_vllm_request_queue_time_seconds_bucket{le="0.01",WorkerId="a"} 5
ray_vllm_request_queue_time_seconds_bucket{le="+Inf",WorkerId="a"} 10
ray_vllm_request_queue_time_seconds_bucket{le="0.01",WorkerId="b"} 5
ray_vllm_request_queue_time_seconds_bucket{le="+Inf",WorkerId="b"} 10
ray_vllm_request_queue_time_seconds_sum{WorkerId="a"} 1.0
ray_vllm_request_queue_time_seconds_sum{WorkerId="b"} 1.0
ray_vllm_request_queue_time_seconds_count{WorkerId="a"} 10
ray_vllm_request_queue_time_seconds_count{WorkerId="b"} 10
ray_vllm_nixl_failed_transfer_count_total{WorkerId="a"} 3
"""


def test_histogram_delta_mean_and_quantiles():
    d = sm.diff(BEFORE, AFTER)["histograms"]["time_to_first_token_seconds"]
    assert d["count"] == 10
    assert d["mean_ms"] == pytest.approx(250.0)
    # 5 in (0.1,0.2], 5 in (0.2,0.4]: p50 at the 0.2 boundary, p90 at 0.36
    assert d["p50_ms"] == pytest.approx(200.0)
    assert d["p90_ms"] == pytest.approx(360.0)
    assert d["metric"] == "vllm:time_to_first_token_seconds"


def test_kv_evidence_delta():
    kv = sm.diff(BEFORE, AFTER)["kv"]
    assert kv["external_kv_prompt_tokens"] == 2500
    assert kv["kv_transfer_observed"] and kv["kv_metric_present"]
    assert kv["nixl_failed_transfers"] == 0


def test_ray_prefix_summed_over_replicas_and_nixl_failures():
    res = sm.diff("", RAY)
    q = res["histograms"]["request_queue_time_seconds"]
    assert q["count"] == 20 and q["mean_ms"] == pytest.approx(100.0)
    assert q["p50_ms"] == pytest.approx(10.0)
    assert res["kv"]["nixl_failed_transfers"] == 3
    assert not res["kv"]["kv_transfer_observed"] and not res["kv"]["kv_metric_present"]


def test_small_parser_matches():
    samples = sm.parse_small(AFTER)
    names = {s[0] for s in samples}
    assert "vllm:time_to_first_token_seconds_bucket" in names
    inf = [s for s in samples if dict(s[1]).get("le") == "+Inf"]
    assert inf and inf[0][2] == 14
    assert sorted(sm.parse(AFTER)) == sorted(samples)


def test_scraper_around_fake_server():
    from tests.fakes.known_timing_server import KnownTimingServer
    with KnownTimingServer() as s:
        sc = sm.Scraper(f"http://127.0.0.1:{s.port}/metrics")
        sc.before()
        res = sc.after()
    assert "kv" in res and res["kv"]["external_kv_prompt_tokens"] == 0
    bad = sm.Scraper("http://127.0.0.1:1/metrics")
    bad.before()
    assert "error" in bad.after()


def test_selection_and_phases_split_one_endpoint_shared_by_several_engines():
    from validation import server_metrics

    def scrape(prefill_ttft: float, decode_ttft: float, other_kv: float) -> str:
        lines = []
        for replica, total in (("p1", prefill_ttft), ("d1", decode_ttft), ("x9", 5.0)):
            lines += [f'ray_vllm_time_to_first_token_seconds_bucket{{ReplicaId="{replica}",le="0.1"}} 0',
                      f'ray_vllm_time_to_first_token_seconds_bucket{{ReplicaId="{replica}",le="+Inf"}} {total}',
                      f'ray_vllm_time_to_first_token_seconds_count{{ReplicaId="{replica}"}} {total}',
                      f'ray_vllm_time_to_first_token_seconds_sum{{ReplicaId="{replica}"}} {total * 0.5}']
        lines.append(f'ray_vllm_prompt_tokens_by_source_total{{ReplicaId="x9",source="external_kv_transfer"}} {other_kv}')
        return "\n".join(lines) + "\n"

    ours = {"ReplicaId": ["p1", "d1"]}
    res = server_metrics.diff(scrape(0, 0, 0), scrape(3, 4, 100), ours,
                              {"prefill": {"ReplicaId": ["p1"]}, "decode": {"ReplicaId": ["d1"]}})
    assert res["histograms"]["time_to_first_token_seconds"]["count"] == 7      # x9 (another slot) left out
    assert res["kv"]["external_kv_prompt_tokens"] == 0                         # its KV too
    assert res["phases"]["prefill"]["time_to_first_token_seconds"]["count"] == 3
    assert res["phases"]["decode"]["time_to_first_token_seconds"]["count"] == 4


def ttft_count(n: int) -> str:
    return f'ray_vllm_time_to_first_token_seconds_count{{ReplicaId="d1"}} {n}\n'


def test_scraper_waits_out_the_export_lag_and_retries_until_every_request_shows(monkeypatch):
    """Ray exports a worker's metrics every 10 s (measured 10.4 s): a scrape right after a short run
    still shows the values from before it."""
    exported = iter([ttft_count(3), ttft_count(3), ttft_count(3), ttft_count(9)])
    slept: list[float] = []
    monkeypatch.setattr(sm, "scrape", lambda url: next(exported))
    monkeypatch.setattr(sm.time, "sleep", slept.append)
    sc = sm.Scraper("http://127.0.0.1:9/metrics", lag_s=10)
    sc.before()
    assert slept == [10]                                   # compat/warmup requests exported first
    res = sc.after(requests_ok=6)
    assert res["histograms"]["time_to_first_token_seconds"]["count"] == 6
    assert (res["requests_seen"], res["requests_ok"]) == (6, 6) and slept == [10, 1.0, 1.0]


def test_scraper_gives_up_after_three_lags_and_says_how_much_it_saw(monkeypatch):
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(sm, "scrape", lambda url: ttft_count(3))
    monkeypatch.setattr(sm.time, "sleep", lambda s: None)
    monkeypatch.setattr(sm.time, "monotonic", lambda: next(clock))
    sc = sm.Scraper("http://127.0.0.1:9/metrics", lag_s=10)
    sc.before()
    res = sc.after(requests_ok=6)
    assert (res["requests_seen"], res["requests_ok"]) == (0, 6)


def _ttft(replica: str, n: int) -> str:
    return (f'ray_vllm_time_to_first_token_seconds_bucket{{ReplicaId="{replica}",le="+Inf"}} {n}\n'
            f'ray_vllm_time_to_first_token_seconds_count{{ReplicaId="{replica}"}} {n}\n'
            f'ray_vllm_time_to_first_token_seconds_sum{{ReplicaId="{replica}"}} {n * 0.1}\n')


def test_several_tagged_sources_split_per_phase_and_a_replaced_pod_counts_from_zero():
    """Ray on Kubernetes: each worker pod exports its own engine; a pod replaced mid-run is a new source."""
    srcs = sm.sources("http://10.0.0.1:8080/metrics#prefill, http://10.0.0.2:8080/metrics#decode,http://10.0.0.3:8080/metrics#decode")
    assert [(s.url, s.phase) for s in srcs] == [("http://10.0.0.1:8080/metrics", "prefill"), ("http://10.0.0.2:8080/metrics", "decode"),
                                                ("http://10.0.0.3:8080/metrics", "decode")]
    phase_of = {s.url: s.phase for s in srcs}
    before = {srcs[0].url: _ttft("p1", 10), srcs[1].url: _ttft("d1", 10)}           # d2's pod not there yet
    after = {srcs[0].url: _ttft("p1", 14), srcs[2].url: _ttft("d2", 4)}             # d1's pod gone, d2 new
    res = sm.diff_sources(before, after, phase_of)
    assert {p: h["time_to_first_token_seconds"]["count"] for p, h in res["phases"].items()} == {"prefill": 4, "decode": 4}
    assert res["histograms"]["time_to_first_token_seconds"]["count"] == 8
    assert sm.sources("http://127.0.0.1:8080/metrics") == [sm.Source("http://127.0.0.1:8080/metrics", None)]
