"""How loaded each phase was during a benchmark run, from its engines' own Prometheus series:
queue and running requests, KV-cache usage, prompt/generation tokens per second, decode ITL.

vLLM exports the scheduler's state as gauges (vllm/v1/metrics/loggers.py: num_requests_running,
num_requests_waiting, num_requests_waiting_by_reason{reason="capacity"|"deferred"},
kv_cache_usage_perc) and Ray Serve LLM's engines the same through vllm/v1/metrics/ray_wrappers.py:
':' becomes '_', Ray's agent adds the `ray_` prefix and `_total` to counters, and every series
carries ReplicaId. A gauge is a state at one instant, so `GaugeSampler` scrapes it during the
load; the histograms' sums give the same averages without sampling (Little's law: the summed
time requests spent waiting / the window = the mean number waiting). The gauges decide when sampled:
Ray's OpenTelemetry recorder exports a histogram as bucket counts at each bucket's midpoint
(ray/_private/telemetry/open_telemetry_metric_recorder.py), so on Ray a `_sum` is approximate and
a queue of 0 s reads as 150 ms (half of vLLM's first 0.3 s bucket): measured on the local stack, a
decode engine that never queued showed 1.18 "waiting" by Little's law, 0 by its gauges.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict

from validation.server_metrics import PREFIXES, Sample, Scraper, histogram_deltas, parse, scrape, selected

GAUGES = ("num_requests_running", "num_requests_waiting", "num_requests_waiting_by_reason", "kv_cache_usage_perc")
# What names one engine: vLLM's per-engine labels (loggers.py labelnames), Ray's ReplicaId, and the
# endpoint it was scraped from (each node numbers its engines from 0). Other labels (Ray's WorkerId,
# an exporter's scope labels) may differ between one engine's series.
_IDENTITY = ("__source", "ReplicaId", "engine", "model_name")


def _short(name: str) -> str | None:
    for p in PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return None


class GaugeSampler:
    """Scrapes every source of a Scraper each `interval_s` in a thread, keeping only the gauge lines
    (a Ray node's page is ~100k characters; parsing is left until after the load, so the thread
    holds the GIL for a substring filter only while the load generator may share the process)."""

    MAX_SAMPLES = 1000

    def __init__(self, scraper: Scraper, interval_s: float):
        self.urls = [s.url for s in scraper.sources]
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.samples) < self.MAX_SAMPLES:
            texts = {}
            for url in self.urls:
                try:
                    texts[url] = "\n".join(ln for ln in scrape(url, timeout=5).splitlines()
                                           if any(g in ln for g in GAUGES) and not ln.startswith("#"))
                except Exception:  # noqa: BLE001 - a missed sample only thins the average
                    continue
            if texts:
                self.samples.append((time.time(), texts))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GaugeSampler:
        if self.urls:
            self._thread = threading.Thread(target=self._run, name="gauge-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)


def by_phase(texts: dict[str, str], scraper: Scraper) -> dict[str, list[Sample]]:
    """Each phase's samples in scrapes of the scraper's sources: tagged sources (one per node), or the
    phases' label selections in one endpoint (both slots on one local Ray)."""
    out: dict[str, list[Sample]] = defaultdict(list)
    tagged = any(s.phase for s in scraper.sources)
    for src in scraper.sources:
        if src.url not in texts:
            continue
        # the source is part of an engine's identity: each node numbers its engines from 0
        samples = [(n, lab + (("__source", src.url),), v) for n, lab, v in parse(texts[src.url])]
        if tagged and src.phase:
            out[src.phase] += selected(samples, scraper.select)
        elif not tagged:
            for phase, sel in (scraper.phases or {}).items():
                out[phase] += selected(samples, sel)
    return dict(out)


def engine_key(labels: tuple[tuple[str, str], ...]) -> tuple:
    d = dict(labels)
    return tuple(d.get(k) for k in _IDENTITY)


def gauge_totals(samples: list[Sample]) -> dict[str, tuple[float, int]]:
    """{gauge: (sum over the phase's engines, engines)} at one instant; waiting counts requests that
    wait for capacity (reason="capacity") where vLLM says why: on a decode engine the others wait for
    their KV to arrive ("deferred"), a transfer, not a queue."""
    sums: dict[str, float] = defaultdict(float)
    engines: dict[str, set] = defaultdict(set)
    for name, labels, value in samples:
        short = _short(name)
        if short is None:
            continue
        d = dict(labels)
        if short == "num_requests_waiting_by_reason":
            if d.get("reason") != "capacity":
                continue
            short = "waiting_capacity"
        if short in ("num_requests_running", "num_requests_waiting", "waiting_capacity", "kv_cache_usage_perc"):
            sums[short] += value
            engines[short].add(engine_key(labels))
    return {k: (v, len(engines[k])) for k, v in sums.items()}


def counter_delta(before: list[Sample], after: list[Sample], base: str) -> float | None:
    """Growth of a counter over the window: `<base>_total` where exported (Ray's agent and
    prometheus_client), else `<base>` (Ray also keeps a deprecated gauge copy without `_total`)."""
    def total(samples: list[Sample]) -> tuple[float, bool]:
        with_total = [v for n, _, v in samples if _short(n) == base + "_total"]
        if with_total:
            return sum(with_total), True
        plain = [v for n, _, v in samples if _short(n) == base]
        return sum(plain), bool(plain)

    (b, _), (a, seen) = total(before), total(after)
    return a - b if seen else None


def histogram_sum_delta(before: list[Sample], after: list[Sample], base: str) -> float | None:
    def total(samples: list[Sample]) -> tuple[float, bool]:
        vals = [v for n, _, v in samples if _short(n) == base + "_sum"]
        return sum(vals), bool(vals)

    (b, _), (a, seen) = total(before), total(after)
    return a - b if seen else None


def engines_in(samples: list[Sample]) -> int:
    return len({engine_key(lab) for n, lab, _ in samples if (_short(n) or "").startswith(
        ("num_requests_", "kv_cache_usage_perc", "request_queue_time_seconds", "time_to_first_token_seconds"))})


def figures(phase: str, before: list[Sample], after: list[Sample], gauge_samples: list[list[Sample]],
            window_s: float) -> dict:
    """One phase's load over the window: plain data for validation.balance.PhaseLoad."""
    hist = histogram_deltas(before, after)
    totals = [gauge_totals(s) for s in gauge_samples]
    totals = [t for t in totals if t]

    def series(key: str, per_engine: bool = False) -> list[float]:
        return [t[key][0] / (t[key][1] if per_engine else 1) for t in totals if key in t and t[key][1]]

    waiting = series("waiting_capacity") or series("num_requests_waiting")
    running, kv = series("num_requests_running"), series("kv_cache_usage_perc", per_engine=True)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    queue_s = histogram_sum_delta(before, after, "request_queue_time_seconds")
    inference_s = histogram_sum_delta(before, after, "request_inference_time_seconds")
    prompt = counter_delta(before, after, "prompt_tokens")
    generated = counter_delta(before, after, "generation_tokens")
    q, itl = hist.get("request_queue_time_seconds") or {}, hist.get("inter_token_latency_seconds") or {}
    per_s = lambda v: None if v is None or window_s <= 0 else v / window_s  # noqa: E731
    return {"phase": phase, "engines": engines_in(after), "window_s": window_s, "gauge_samples": len(totals),
            "waiting_mean": mean(waiting), "waiting_max": max(waiting, default=None),
            "running_mean": mean(running), "running_max": max(running, default=None),
            "kv_usage_mean": mean(kv), "kv_usage_max": max(kv, default=None),
            "waiting_little": per_s(queue_s), "running_little": per_s(inference_s),
            "queue_ms_mean": q.get("mean_ms"), "queue_ms_p90": q.get("p90_ms"), "requests": q.get("count"),
            "prompt_tokens_per_s": per_s(prompt), "generation_tokens_per_s": per_s(generated),
            "itl_ms_p50": itl.get("p50_ms") if itl.get("count") else None,
            "itl_ms_p90": itl.get("p90_ms") if itl.get("count") else None}


def measure(scraper: Scraper, sampler: GaugeSampler | None, t_start: float, t_end: float,
            lag_s: float = 0.0) -> dict[str, dict] | None:
    """Per phase figures of one run; None when the metrics name no phases. Gauge samples count from
    t_start + lag_s to t_end + lag_s: an endpoint lag_s stale shows then what the engines held during
    the load."""
    if scraper.after_texts is None or scraper.before_texts is None:
        return None
    before, after = by_phase(scraper.before_texts, scraper), by_phase(scraper.after_texts, scraper)
    if not after:
        return None
    inside = [texts for t, texts in (sampler.samples if sampler else [])
              if t_start + lag_s <= t <= t_end + lag_s]
    samples = [by_phase(texts, scraper) for texts in inside]
    return {phase: figures(phase, before.get(phase, []), after[phase], [s.get(phase, []) for s in samples],
                           t_end - t_start) for phase in sorted(after)}
