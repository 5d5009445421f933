"""One benchmark run: profile -> load -> metrics + client health + server-side diff -> BenchReport."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from validation import balance, interim, loadgen, metrics, phase_load, profiles, server_metrics, traces
from validation.config import BalancePolicy
from validation.reports.bench import BenchReport, Quantiles, StoppedEarly


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run sends, where it sends it and what it watches: `run_bench(BenchConfig(...))`.

    The load: exactly one of `concurrency` (closed loop) or `rate` (open loop, `poisson` arrivals or
    evenly spaced), and `requests` and/or `duration`; `warmup` requests go first, outside the window.
    `trace`: replay its arrivals and lengths (open loop) instead of the profile at a load; it sets
    the request count and clears concurrency, rate and duration.
    `ramp_s`: the load rises over this many seconds instead of starting as a burst (validation/loadgen.py).
    `workers`: client processes; `isolate`: the load runs in a process of its own at a higher priority
    where permitted (loadgen.run_workers), not in the caller's.
    `tokenizer`: a local HF tokenizer directory of the served model, for exact prompt lengths.
    `metrics_lag_s`: how stale `metrics_url` can be (server_metrics.RAY_METRICS_LAG_S for Ray).
    `balance_policy`: when a phase counts as queueing (validation/balance.py); the run's `balance`
    needs per-phase metrics (tagged sources or `metrics_phases`), its gauges sampled every
    `sample_interval_s` (default: 1 s, a quarter of `metrics_lag_s` when that is longer).
    `metrics_source`: where the server figures come from instead of the direct scrape's diff (a
    Prometheus that scrapes the engines, validation/prometheus.py); the gauges of the phase balance
    still come from `metrics_url`.
    """
    base_url: str
    model: str
    profile: profiles.Profile
    # the load
    concurrency: int | None = None
    rate: float | None = None
    poisson: bool = False
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    # the requests
    api_key: str | None = None
    endpoint: str = "chat"
    seed: int = 0
    tokenizer: str | None = None
    timeout: float = 600.0
    trace: traces.Trace | None = None
    ramp_s: float = 0.0
    # the client
    workers: int = 1
    isolate: bool = False
    progress: Callable[[str], None] | None = None
    # the server's side
    metrics_url: str | None = None
    metrics_select: dict[str, list[str]] | None = None
    metrics_phases: dict[str, dict[str, list[str]]] | None = None
    metrics_lag_s: float = 0.0
    sample_interval_s: float | None = None
    metrics_source: server_metrics.MetricsSource | None = None
    balance_policy: BalancePolicy | None = None
    # the report
    goodput_ttft_ms: float | None = None
    goodput_tpot_ms: float | None = None
    keep_samples: bool = True
    # Interim looks (slo.statistics.stop_early, validation/interim.py): stop(the bench so far, requests
    # completed, requests planned) at interim.points of `requests`; a record it returns ends the load
    # (the report's `stopped_early`). A count load with one client process only (not a trace or a duration).
    stop: Callable[[BenchReport, int, int], StoppedEarly | None] | None = None


def run_bench(config: BenchConfig) -> BenchReport:
    """Warm up, open the server's metrics window, run the load, close the window, report."""
    cfg = _with_trace_load(config)
    spec = _load_spec(cfg)
    scraper = server_metrics.Scraper(cfg.metrics_url, cfg.metrics_select, cfg.metrics_phases, cfg.metrics_lag_s)
    if cfg.progress:
        cfg.progress(_start_line(cfg))
    started = time.time()
    if cfg.warmup:  # before the first scrape, so the server's histograms hold the measured requests only
        loadgen.run(dataclasses.replace(spec, concurrency=1, rate=None, requests=0, duration=None))
        spec = dataclasses.replace(spec, warmup=0)
    window = _measure(cfg, spec, scraper)
    report = BenchReport.model_validate(_report_fields(cfg, started, window))
    if cfg.progress:
        t = report.ttft_ms or Quantiles()
        cfg.progress(f"[bench] done: {report.requests_ok} ok, {report.errors} errors, TTFT p50 {_ms(t.p50)} "
                     f"p99 {_ms(t.p99)}")
        if report.stopped_early is not None:
            cfg.progress(f"[bench] {report.stopped_early.reason}")
    return report


def _with_trace_load(cfg: BenchConfig) -> BenchConfig:
    """The config with a trace's load in place of the profile's (its arrivals set the pace and the
    count); a load without a size or with neither or both of concurrency and rate is a ValueError."""
    if cfg.trace is not None:
        return dataclasses.replace(cfg, concurrency=None, rate=None, duration=None, requests=len(cfg.trace.requests))
    if cfg.requests is None and cfg.duration is None:
        raise ValueError("need requests or duration")
    if (cfg.concurrency is None) == (cfg.rate is None):
        raise ValueError("need exactly one of concurrency or rate")
    return cfg


def _load_spec(cfg: BenchConfig) -> loadgen.LoadSpec:
    """The load generator's spec: the profile's requests (or the trace's lengths) at the config's load."""
    trace = cfg.trace
    tokenizer = profiles.Tokenizer(cfg.tokenizer, cfg.endpoint) if cfg.tokenizer else None
    make_request = profiles.request_factory(cfg.profile, cfg.seed, cfg.endpoint, tokenizer,
                                            trace.lengths if trace else None)
    looks = cfg.stop is not None and trace is None and cfg.requests is not None and cfg.workers <= 1
    return loadgen.LoadSpec(base_url=cfg.base_url, model=cfg.model, make_request=make_request,
                            look_at=interim.points(cfg.requests) if looks and cfg.requests else None,
                            look=_look(cfg) if looks else None,
                            endpoint=cfg.endpoint, concurrency=cfg.concurrency, rate=cfg.rate,
                            poisson=cfg.poisson, requests=cfg.requests, duration=cfg.duration,
                            warmup=cfg.warmup, api_key=cfg.api_key, seed=cfg.seed,
                            progress=cfg.progress is not None, timeout=cfg.timeout,
                            arrivals=trace.arrivals if trace else None, ramp_s=0.0 if trace else cfg.ramp_s)


def _look(cfg: BenchConfig) -> Callable[[list[dict], float, int], dict[str, Any] | None]:
    """An interim look for the load generator: the records completed so far as a bench report (the
    client's figures and samples, what the gate judges), asked of `cfg.stop`; its record as a dict (it
    crosses from the client's process). The requests in flight count as successes so far among the
    outcomes the error test reads: a fast failure (an instant 500) completes before the slow successes
    sent with it, so the completed requests alone would overstate the error rate at a look."""
    def look(records: list[dict], wall_s: float, in_flight: int) -> dict[str, Any] | None:
        assert cfg.stop is not None and cfg.requests is not None
        m = metrics.compute(records, wall_s, cfg.goodput_ttft_ms, cfg.goodput_tpot_ms,
                            open_loop=bool(cfg.rate))
        samples = metrics.samples(records)
        samples["outcomes"] += [1] * max(0, in_flight)
        so_far = BenchReport.model_validate({"kind": "bench", "profile": cfg.profile.name, **m,
                                             "samples": samples})
        got = cfg.stop(so_far, len(records), cfg.requests)
        return got.model_dump(mode="json") if got is not None else None
    return look


def _start_line(cfg: BenchConfig) -> str:
    """The progress line that opens a run: profile, load and size."""
    trace = cfg.trace
    load = (f"trace {trace.name} ({trace.arrivals[-1]:.0f} s)" if trace else
            f"concurrency {cfg.concurrency}" if cfg.concurrency else f"{cfg.rate:g} requests/s")
    size = f"{cfg.requests} requests" if cfg.requests else f"{cfg.duration:g} s"
    return f"[bench] {cfg.profile.name}: {load}, {size}" + (f", {cfg.warmup} warm-up" if cfg.warmup else "")


@dataclass
class _Window:
    """What the measured window produced: the load's result, its client-side metrics, the server's
    figures over the window and the phases' gauges (None without per-phase metrics)."""
    load: dict[str, Any]
    metrics: dict[str, Any]
    server: dict[str, Any] | None
    phases: dict[str, dict] | None


def _measure(cfg: BenchConfig, spec: loadgen.LoadSpec, scraper: server_metrics.Scraper) -> _Window:
    """Scrape the server, run the load (gauges sampled meanwhile), scrape again: the measured window."""
    if cfg.progress and cfg.metrics_url and cfg.metrics_lag_s:
        cfg.progress(f"[bench] waiting {cfg.metrics_lag_s:.0f}s for the server's metrics to catch up before the "
                     "window opens")
    scraper.before()
    source = cfg.metrics_source
    opened = source.open(cfg.metrics_lag_s if cfg.metrics_url else 0.0) if source is not None else time.time()
    # A process that imported Ray/vLLM (as `pdops release` has) holds ~700k objects; one full
    # collection then stalls the event loop ~0.5 s (measured), which the harness would report as
    # latency. Frozen objects are never scanned; new ones still are.
    gc.collect()
    gc.freeze()
    # the engines' queue and KV gauges during the load (validation/phase_load.py); on Ray, which
    # exports every 10 s, four samples per export
    sampler = phase_load.GaugeSampler(scraper, cfg.sample_interval_s or max(1.0, cfg.metrics_lag_s / 4)) \
        if cfg.metrics_url else None
    with sampler or contextlib.nullcontext():
        load_started = time.time()
        try:
            res = loadgen.run_workers(spec, cfg.workers, cfg.isolate) if cfg.workers > 1 or cfg.isolate \
                else loadgen.run(spec)
        finally:
            gc.unfreeze()
        load_ended = time.time()
        m = metrics.compute(res["records"], res["wall_s"], cfg.goodput_ttft_ms, cfg.goodput_tpot_ms,
                            open_loop=bool(cfg.rate) or cfg.trace is not None)
        server = scraper.after(m["requests_ok"])   # the sampler runs on: gauges lag as much as the rest
        if source is not None:
            server = source.window(opened, load_ended, m["requests_ok"]).model_dump(mode="json", exclude_none=True)
    phases = phase_load.measure(scraper, sampler, load_started, load_ended, cfg.metrics_lag_s) \
        if server and not server.get("error") else None
    return _Window(res, m, server, phases)


def _report_fields(cfg: BenchConfig, started: float, window: _Window) -> dict[str, Any]:
    """The BenchReport's fields: the run's settings, the client's metrics and health, the prompt
    lengths served, the server's figures and phase balance, and why a figure is missing."""
    res, server, profile = window.load, window.server, cfg.profile
    out: dict[str, Any] = {
        "kind": "bench", "base_url": cfg.base_url, "model": cfg.model, "profile": profile.name,
        "profile_spec": {"prompt_tokens": profile.prompt_tokens, "output_tokens": profile.output_tokens,
                         "distribution": profile.distribution, "spread": profile.spread},
        "load": {"mode": res["mode"], "concurrency": cfg.concurrency, "rate": cfg.rate, "poisson": cfg.poisson,
                 "requests": cfg.requests, "duration_s": cfg.duration, "warmup": cfg.warmup,
                 "workers": cfg.workers, "trace": cfg.trace.name if cfg.trace else None,
                 "ramp_s": None if cfg.trace else cfg.ramp_s},
        "started_unix": started,
        **window.metrics,
        "client_health": res["client_health"],
        "lengths": {**profiles.verify_lengths(res["records"]),
                    "prompts_from": f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else
                    "one word per token (no tokenizer)"},
        "server": server,
        "stopped_early": res.get("stopped"),
    }
    if window.phases:
        out["balance"] = balance.judge(window.phases, cfg.balance_policy).model_dump(mode="json")
    if cfg.keep_samples:
        out["samples"] = metrics.samples(res["records"])
    # why a figure is null (docs/reports.md): the producer knows best; BenchReport fills the rest
    missing = out["missing"]
    if server is None:
        missing["server"] = "no metrics URL given: the server's metrics were not scraped"
    elif server.get("error"):
        missing["server"] = f"server metrics not scraped: {server['error']}"
    if out["lengths"]["prompt_ratio_mean"] is None:
        missing["lengths.prompt_ratio_mean"] = "no answer carried usage.prompt_tokens"
    return out


def _ms(value: float | None) -> str:
    """A latency for a progress line: whole milliseconds, one decimal below 10 ms; '-' when none."""
    if value is None:
        return "-"
    return f"{value:.1f} ms" if value < 10 else f"{value:.0f} ms"
