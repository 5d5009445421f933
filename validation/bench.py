"""One benchmark run: profile -> load -> metrics + client health + server-side diff -> BenchReport."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

from validation import balance, loadgen, metrics, phase_load, profiles, server_metrics, traces
from validation.config import BalancePolicy
from validation.reports.bench import BenchReport, Quantiles


def run_bench(base_url: str, model: str, profile: profiles.Profile, concurrency: int | None = None,
              rate: float | None = None, poisson: bool = False, requests: int | None = None,
              duration: float | None = None, warmup: int = 0, metrics_url: str | None = None,
              api_key: str | None = None, endpoint: str = "chat", goodput_ttft_ms: float | None = None,
              goodput_tpot_ms: float | None = None, seed: int = 0, keep_samples: bool = True, workers: int = 1,
              metrics_select: dict[str, list[str]] | None = None,
              metrics_phases: dict[str, dict[str, list[str]]] | None = None,
              progress: Callable[[str], None] | None = None, tokenizer: str | None = None,
              timeout: float = 600.0, metrics_lag_s: float = 0.0, trace: traces.Trace | None = None,
              isolate: bool = False, balance_policy: BalancePolicy | None = None,
              sample_interval_s: float | None = None,
              metrics_source: server_metrics.MetricsSource | None = None, ramp_s: float = 0.0) -> BenchReport:
    """`tokenizer`: a local HF tokenizer directory of the served model, for exact prompt lengths.
    `metrics_lag_s`: how stale `metrics_url` can be (server_metrics.RAY_METRICS_LAG_S for Ray).
    `trace`: replay its arrivals and lengths (open loop) instead of the profile at a load.
    `isolate`: the load runs in a process of its own at a higher priority where permitted
    (loadgen.run_workers), not in the caller's.
    `balance_policy`: when a phase counts as queueing (validation/balance.py); the run's `balance`
    needs per-phase metrics (tagged sources or `metrics_phases`), its gauges sampled every
    `sample_interval_s` (default: 1 s, a quarter of `metrics_lag_s` when that is longer).
    `metrics_source`: where the server figures come from instead of the direct scrape's diff (a
    Prometheus that scrapes the engines, validation/prometheus.py); the gauges of the phase balance
    still come from `metrics_url`.
    `ramp_s`: the load rises over this many seconds instead of starting as a burst (validation/loadgen.py)."""
    if trace is not None:
        concurrency, rate, duration, requests = None, None, None, len(trace.requests)
    elif requests is None and duration is None:
        raise ValueError("need requests or duration")
    elif (concurrency is None) == (rate is None):
        raise ValueError("need exactly one of concurrency or rate")
    spec = loadgen.LoadSpec(base_url=base_url, model=model,
                            make_request=profiles.request_factory(
                                profile, seed, endpoint, profiles.Tokenizer(tokenizer, endpoint) if tokenizer else None,
                                trace.lengths if trace else None),
                            endpoint=endpoint,
                            concurrency=concurrency, rate=rate, poisson=poisson, requests=requests,
                            duration=duration, warmup=warmup, api_key=api_key, seed=seed,
                            progress=progress is not None, timeout=timeout,
                            arrivals=trace.arrivals if trace else None, ramp_s=0.0 if trace else ramp_s)
    scraper = server_metrics.Scraper(metrics_url, metrics_select, metrics_phases, metrics_lag_s)
    if progress:
        load = (f"trace {trace.name} ({trace.arrivals[-1]:.0f} s)" if trace else
                f"concurrency {concurrency}" if concurrency else f"{rate:g} requests/s")
        size = f"{requests} requests" if requests else f"{duration:g} s"
        progress(f"[bench] {profile.name}: {load}, {size}" + (f", {warmup} warm-up" if warmup else ""))
    started = time.time()
    if warmup:  # before the first scrape, so the server's histograms hold the measured requests only
        loadgen.run(dataclasses.replace(spec, concurrency=1, rate=None, requests=0, duration=None))
        spec = dataclasses.replace(spec, warmup=0)
    if progress and metrics_url and metrics_lag_s:
        progress(f"[bench] waiting {metrics_lag_s:.0f}s for the server's metrics to catch up before the window opens")
    scraper.before()
    opened = metrics_source.open(metrics_lag_s if metrics_url else 0.0) if metrics_source is not None else time.time()
    # A process that imported Ray/vLLM (as `pdops release` has) holds ~700k objects; one full
    # collection then stalls the event loop ~0.5 s (measured), which the harness would report as
    # latency. Frozen objects are never scanned; new ones still are.
    gc.collect()
    gc.freeze()
    # the engines' queue and KV gauges during the load (validation/phase_load.py); on Ray, which
    # exports every 10 s, four samples per export
    sampler = phase_load.GaugeSampler(scraper, sample_interval_s or max(1.0, metrics_lag_s / 4)) \
        if metrics_url else None
    with sampler or contextlib.nullcontext():
        load_started = time.time()
        try:
            res = loadgen.run_workers(spec, workers, isolate) if workers > 1 or isolate else loadgen.run(spec)
        finally:
            gc.unfreeze()
        load_ended = time.time()
        m = metrics.compute(res["records"], res["wall_s"], goodput_ttft_ms, goodput_tpot_ms,
                            open_loop=bool(rate) or trace is not None)
        server = scraper.after(m["requests_ok"])   # the sampler runs on: gauges lag as much as the rest
        if metrics_source is not None:
            server = metrics_source.window(opened, load_ended, m["requests_ok"]).model_dump(mode="json",
                                                                                           exclude_none=True)
    phases = phase_load.measure(scraper, sampler, load_started, load_ended, metrics_lag_s) \
        if server and not server.get("error") else None
    out: dict[str, Any] = {
        "kind": "bench", "base_url": base_url, "model": model, "profile": profile.name,
        "profile_spec": {"prompt_tokens": profile.prompt_tokens, "output_tokens": profile.output_tokens,
                         "distribution": profile.distribution, "spread": profile.spread},
        "load": {"mode": res["mode"], "concurrency": concurrency, "rate": rate, "poisson": poisson,
                 "requests": requests, "duration_s": duration, "warmup": warmup,
                 "workers": workers, "trace": trace.name if trace else None,
                 "ramp_s": None if trace else ramp_s},
        "started_unix": started,
        **m,
        "client_health": res["client_health"],
        "lengths": {**profiles.verify_lengths(res["records"]),
                    "prompts_from": f"tokenizer {tokenizer}" if tokenizer else "one word per token (no tokenizer)"},
        "server": server,
    }
    if phases:
        out["balance"] = balance.judge(phases, balance_policy).model_dump(mode="json")
    if keep_samples:
        out["samples"] = metrics.samples(res["records"])
    # why a figure is null (docs/reports.md): the producer knows best; BenchReport fills the rest
    missing = out["missing"]
    if server is None:
        missing["server"] = "no metrics URL given: the server's metrics were not scraped"
    elif server.get("error"):
        missing["server"] = f"server metrics not scraped: {server['error']}"
    if out["lengths"]["prompt_ratio_mean"] is None:
        missing["lengths.prompt_ratio_mean"] = "no answer carried usage.prompt_tokens"
    report = BenchReport.model_validate(out)
    if progress:
        t = report.ttft_ms or Quantiles()
        progress(f"[bench] done: {report.requests_ok} ok, {report.errors} errors, TTFT p50 {_ms(t.p50)} "
                 f"p99 {_ms(t.p99)}")
    return report


def _ms(value: float | None) -> str:
    """A latency for a progress line: whole milliseconds, one decimal below 10 ms; '-' when none."""
    if value is None:
        return "-"
    return f"{value:.1f} ms" if value < 10 else f"{value:.0f} ms"
