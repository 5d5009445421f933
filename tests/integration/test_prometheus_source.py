"""The Prometheus metrics source (validation/prometheus.py) against a REAL Prometheus (the Debian
package's binary, scripts/setup.sh) scraping fake engines on 127.0.0.1 every second: its figures
equal the direct scrape's diff of the same window within what increase() may differ by, through the
benchmark as validation runs it; it survives an engine restart that breaks the direct diff; an
unreachable Prometheus, an empty selection and a too-short window give a null figure with the
reason, which the gate fails closed on."""
from __future__ import annotations

import time

import pytest

from tests import prometheus_support as prom
from tests.fakes.known_timing_server import KnownTimingServer
from tests.fakes.pd_queues import ITL_BUCKETS, QUEUE_BUCKETS, PDQueues
from tests.fakes.restarting_engine import RestartingEngine
from validation import profiles
from validation.bench import BenchConfig, run_bench
from validation.config import SLO
from validation.gate import decide
from validation.prometheus import PrometheusSource
from validation.reports.bench import Histogram, ServerMetrics
from validation.server_metrics import Scraper

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    prom.binary() is None, reason="the Debian package prometheus is not installed (scripts/setup.sh installs it "
    "as root with apt-get; this machine could not)")]

SLOT = {"namespace": "llm-test", "pdops_dev_colour": "blue"}   # what the PodMonitor's relabelling sets
PHASE = "pdops_dev_phase"
INTERVAL_S = 1.0
BOUNDS = {"time_to_first_token_seconds": QUEUE_BUCKETS, "request_queue_time_seconds": QUEUE_BUCKETS,
          "inter_token_latency_seconds": ITL_BUCKETS}


def count_tolerance(window_s: float) -> float:
    """How far increase()'s count may stray from the true one (relative): it extrapolates the samples'
    span to the range by up to 1.1 scrape intervals at each end (promql/functions.go extrapolatedRate),
    and the first sample may already hold what the first interval counted."""
    return 2.2 * INTERVAL_S / (window_s - 2.2 * INTERVAL_S)


def bucket_width_ms(bounds: tuple[float, ...], value_ms: float) -> float:
    """Width of the histogram bucket holding value_ms: how finely a quantile interpolated in it is known."""
    edges = (0.0, *bounds)
    for lo, hi in zip(edges, edges[1:]):
        if value_ms / 1000 <= hi:
            return (hi - lo) * 1000
    return float("inf")


def assert_same(direct: dict[str, Histogram], promql: dict[str, Histogram], tol: float, where: str,
                quantiles: bool = True) -> None:
    assert set(promql) == set(direct), where
    for name, d in direct.items():
        p = promql[name]
        assert p.metric == d.metric
        if not d.count:
            assert not p.count, (where, name)
            continue
        assert p.count == pytest.approx(d.count, rel=tol), (where, name, p.count, d.count)
        # the sum and the count are extrapolated alike, except where a series' first sample is near 0
        # (extrapolatedRate stops at the zero point): the mean is known to the tolerance or a bucket
        assert abs(p.mean_ms - d.mean_ms) <= max(tol * d.mean_ms, bucket_width_ms(BOUNDS[name], d.mean_ms)), \
            (where, name, p.mean_ms, d.mean_ms)
        for q in [] if not quantiles else ("p50_ms", "p90_ms", "p99_ms"):
            dv, pv = getattr(d, q), getattr(p, q)
            assert abs(pv - dv) <= bucket_width_ms(BOUNDS[name], dv), (where, name, q, pv, dv)


def test_promql_figures_equal_the_direct_scrape_of_the_same_run(tmp_path):
    """A P/D fake whose two engines export Ray's ray_vllm_* series per phase, as two scrape targets:
    the bench takes its server figures from Prometheus; a direct scrape of the same endpoints around
    the same run is the reference."""
    pd = PDQueues(prefill_slots=2, decode_slots=8, prefill_s=0.01)
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.005, tokens=16, pd=pd) as srv:
        host = srv.base_url[len("http://"):-len("/v1")]
        targets = [prom.Target(host, f"/metrics/{phase}", {**SLOT, PHASE: phase}) for phase in ("prefill", "decode")]
        direct_url = ",".join(f"http://{host}/metrics/{phase}#{phase}" for phase in ("prefill", "decode"))
        with prom.PrometheusServer(tmp_path, targets) as server:
            source = PrometheusSource(server.url, SLOT, PHASE)
            reference = Scraper(direct_url)
            reference.before()
            bench = run_bench(BenchConfig(srv.base_url, "fake-model", profiles.custom(32, 16), concurrency=4, duration=12.0,
                                          metrics_url=direct_url, metrics_source=source))
            direct = reference.window(0.0, 0.0, bench.requests_ok)
    assert direct.error is None and bench.server is not None and bench.server.error is None, bench.server
    got = bench.server
    assert got.url == server.url and bench.requests_ok > 100
    window_s = 12.0 + 2 * INTERVAL_S + source.settle_s   # the range: one interval before, one (+ settle) after
    tol = count_tolerance(window_s)
    assert direct.phases and got.phases and set(got.phases) == {"prefill", "decode"}
    for phase in direct.phases:
        assert_same(direct.phases[phase], got.phases[phase], tol, phase)
    # Over both phases at once, TTFT mixes the prefill engine's (<1 ms) and the decode engine's (~10 ms)
    # half and half: its p50 sits on the seam, where the two targets' own extrapolation factors (they
    # are scraped at different offsets) move it across buckets (measured: 1 ms vs 10 ms). Counts and
    # means only there; ITL, which decode alone records, is the gate's (gate.itl_source) and equal.
    assert_same(direct.histograms, got.histograms, tol, "all", quantiles=False)
    assert_same({"inter_token_latency_seconds": direct.histograms["inter_token_latency_seconds"]},
                {"inter_token_latency_seconds": got.histograms["inter_token_latency_seconds"]}, tol, "all ITL")
    assert got.requests_seen == pytest.approx(bench.requests_ok, rel=tol)
    assert got.kv and direct.kv and got.kv.kv_metric_present and got.kv.kv_transfer_observed
    # the counter, once: 32 prompt words per request reached decode by KV transfer
    assert direct.kv.external_kv_prompt_tokens == 32 * bench.requests_ok
    assert got.kv.external_kv_prompt_tokens == pytest.approx(direct.kv.external_kv_prompt_tokens, rel=tol)
    assert got.kv.nixl_failed_transfers == direct.kv.nixl_failed_transfers == 0
    print(f"\n{prom.version()}: {bench.requests_ok} requests; decode TTFT count direct "
          f"{direct.phases['decode']['time_to_first_token_seconds'].count:g} PromQL "
          f"{got.phases['decode']['time_to_first_token_seconds'].count:.2f} (tolerance {tol:.0%})")


def test_an_engine_restart_mid_window_is_counted_by_increase(tmp_path):
    """The engine restarts (its counters start again from 0) in the middle of the window: increase()
    adds what was counted before the reset (docs/querying/functions.md: counter resets "are
    automatically adjusted for"); the direct scrape's after-minus-before cannot."""
    with RestartingEngine() as eng:
        eng.observe([0.003] * 20, kv_tokens=500, nixl_failures=3)   # before the window: not counted
        with prom.PrometheusServer(tmp_path, [prom.Target(eng.target, "/metrics", {**SLOT, PHASE: "decode"})]) as server:
            direct = Scraper(eng.url)
            direct.before()
            source = PrometheusSource(server.url, SLOT, PHASE)
            start = source.open()
            eng.observe([0.03] * 10, kv_tokens=100)
            time.sleep(3 * INTERVAL_S)            # scraped before the restart
            eng.restart()
            time.sleep(3 * INTERVAL_S)            # the zeroed counters are scraped too
            eng.observe([0.3] * 10, kv_tokens=100, nixl_failures=1)
            time.sleep(3 * INTERVAL_S)
            end = time.time()
            got = source.window(start, end, 20)
            broken = direct.window(start, end, 20)
    tol = count_tolerance(end - start + 2 * INTERVAL_S + 0.5)
    ttft = got.histograms["time_to_first_token_seconds"]
    assert ttft.count == pytest.approx(20, rel=tol)
    assert ttft.p50_ms is not None and 20 <= ttft.p50_ms <= 40 + 1e-9        # half at 30 ms (bucket 20-40 ms)
    assert ttft.p90_ms is not None and 200 <= ttft.p90_ms <= 300 + 1e-9      # half at 300 ms (bucket 200-300 ms)
    assert got.phases and got.phases["decode"]["time_to_first_token_seconds"].count == ttft.count
    assert got.kv is not None and got.kv.external_kv_prompt_tokens == pytest.approx(200, rel=tol)
    assert got.kv.nixl_failed_transfers == pytest.approx(1, rel=tol)
    # the direct diff sees 10 requests less than before the window and 400 KV tokens lost
    b = broken.histograms["time_to_first_token_seconds"]
    assert b.count == -10 and broken.kv is not None and broken.kv.external_kv_prompt_tokens == -400


def test_too_short_a_window_and_an_empty_selection_say_why(tmp_path):
    with RestartingEngine() as eng:
        eng.observe([0.03] * 5)
        with prom.PrometheusServer(tmp_path, [prom.Target(eng.target, "/metrics", {**SLOT, PHASE: "decode"})]) as server:
            now = time.time()
            short = PrometheusSource(server.url, SLOT, PHASE).window(now - 1.5, now, 5)
            other = PrometheusSource(server.url, {**SLOT, "pdops_dev_colour": "green"}, PHASE).window(now - 10, now, 5)
            # a window before Prometheus started: the selection's target exists, its series do not
            nothing = PrometheusSource(server.url, SLOT, PHASE).window(now - 300, now - 280, 5)
    assert short.error and "shorter than 2 scrape intervals (1 s)" in short.error and not short.histograms
    assert other.error and "no target with labels" in other.error and "green" in other.error
    assert nothing.error and "has no vLLM series with labels" in nothing.error and nothing.kv is None


def test_unreachable_prometheus_fails_the_gate_closed():
    """No Prometheus at the URL: the bench's server figures are null with the reason, and a gate that
    requires KV-transfer evidence rolls back on it, as it does for a failed direct scrape."""
    closed = prom._free_port()
    with KnownTimingServer(first_token_delay=0.0, inter_token_delay=0.002, tokens=4) as srv:
        bench = run_bench(BenchConfig(srv.base_url, "fake-model", profiles.custom(8, 4), concurrency=2, requests=10,
                                      metrics_source=PrometheusSource(f"http://127.0.0.1:{closed}", SLOT, PHASE)))
    server = bench.server
    assert isinstance(server, ServerMetrics) and server.error and "unreachable" in server.error
    assert not server.histograms and server.kv is None
    assert bench.missing["server"].startswith("server metrics not scraped: Prometheus at http://127.0.0.1:")
    decision = decide(None, [bench], SLO(kv_transfer="required"))
    kv = [c for c in decision.checks if c.check == "kv_transfer"]
    assert decision.verdict == "rollback" and kv and not kv[0].ok and "unreachable" in kv[0].message
