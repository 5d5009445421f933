"""Server-side truth from a Prometheus text endpoint: scrape before and after a run, diff the
vLLM latency histograms (vllm:* or ray_vllm_* names) into mean and approximate quantiles over
the run window, and collect KV-transfer evidence (prompt tokens that arrived by KV transfer;
NIXL failed-transfer counters).
"""
from __future__ import annotations

import math
import re
import time
import urllib.request
from collections import defaultdict
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from validation.reports.bench import BenchReport, ServerMetrics

HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds",
              "request_time_per_output_token_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds", "request_queue_time_seconds")
PREFIXES = ("vllm:", "ray_vllm_", "ray_vllm:")

Sample = tuple[str, tuple[tuple[str, str], ...], float]

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _unescape(v: str) -> str:
    return v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _float(v: str) -> float:
    return float(v.strip())  # float() accepts +Inf, -Inf and NaN


def parse_small(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(m.group(3) or "")))
        try:
            out.append((m.group(1), labels, _float(m.group(4))))
        except ValueError:
            continue
    return out


def parse(text: str) -> list[Sample]:
    """Samples (name, sorted labels, value). prometheus_client's parser when installed."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return parse_small(text)
    try:
        out = []
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.append((s.name, tuple(sorted(s.labels.items())), float(s.value)))
        return out
    except Exception:  # noqa: BLE001 - vLLM names with ':' etc.; fall back
        return parse_small(text)


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - operator-given URL
        return r.read().decode("utf-8", "replace")


def _base(name: str) -> tuple[str, str] | None:
    for p in PREFIXES:
        if name.startswith(p):
            return p, name[len(p):]
    return None


def _quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """histogram_quantile() as Prometheus does it: linear inside the bucket."""
    if count <= 0 or not buckets:
        return None
    rank = q * count
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return buckets[-1][0]


def histogram_deltas(before: list[Sample], after: list[Sample]) -> dict:
    """{short_name: {count, mean_ms, p50_ms, p90_ms, p99_ms, metric}} summed over label sets."""
    def collect(samples):
        b: defaultdict[str, defaultdict[float, float]] = defaultdict(lambda: defaultdict(float))  # short -> le -> cum
        sums: defaultdict[str, float] = defaultdict(float)
        counts: defaultdict[str, float] = defaultdict(float)
        names: dict[str, str] = {}
        for name, labels, v in samples:
            pb = _base(name)
            if not pb:
                continue
            pre, rest = pb
            for h in HISTOGRAMS:
                if rest == h + "_bucket":
                    le = dict(labels).get("le")
                    if le is not None:
                        b[h][math.inf if le == "+Inf" else float(le)] += v
                    names[h] = pre + h
                elif rest == h + "_sum":
                    sums[h] += v
                    names[h] = pre + h
                elif rest == h + "_count":
                    counts[h] += v
                    names[h] = pre + h
        return b, sums, counts, names

    b0, s0, c0, _ = collect(before)
    b1, s1, c1, n1 = collect(after)
    out = {}
    for h in n1:
        les = sorted(set(b1[h]) | set(b0.get(h, {})))
        buckets = [(le, b1[h].get(le, 0.0) - b0.get(h, {}).get(le, 0.0)) for le in les]
        out[h] = histogram_entry(n1[h], buckets, s1.get(h, 0.0) - s0.get(h, 0.0), c1.get(h, 0.0) - c0.get(h, 0.0))
    return out


def histogram_entry(metric: str, buckets: list[tuple[float, float]], total_s: float, count: float) -> dict:
    """One histogram's figures over a window from its deltas: cumulative (le, count) sorted by le, the
    sum in seconds and the count. The direct scrape's diff and the Prometheus source
    (validation/prometheus.py) both end here, so the two give the same typed figures."""
    if count == 0 and buckets:
        count = buckets[-1][1]
    entry: dict[str, Any] = {"metric": metric, "count": count,
                             "mean_ms": (total_s / count * 1000) if count > 0 else None}
    for q in (0.5, 0.9, 0.99):
        v = _quantile(buckets, count, q)
        entry[f"p{int(q * 100)}_ms"] = None if v is None else v * 1000
    return entry


def _counter_total(samples: list[Sample], pred) -> float:
    return sum(v for name, labels, v in samples if pred(name, dict(labels)))


KV_COUNTERS = ("prompt_tokens_by_source_total", "prompt_tokens_by_source")


def is_external_kv(name: str, labels: dict[str, str]) -> bool:
    """Prompt tokens that arrived by KV transfer (vLLM's prompt_tokens_by_source, source external_kv_transfer)."""
    pb = _base(name)
    return pb is not None and pb[1] in KV_COUNTERS and labels.get("source") == "external_kv_transfer"


def is_nixl_failure(name: str) -> bool:
    n = name.lower()
    return "nixl" in n and "fail" in n and not n.endswith(("_created", "_bucket", "_sum"))


def counter_names(names: set[str]) -> set[str]:
    """One name per counter: Ray exports each counter twice, `<name>_total` and a deprecated copy
    without `_total` (ray/_private/metrics_agent.py, as tests/fakes/pd_queues.py serves it); summing
    both counted every KV token and every NIXL failure twice. The bare name counts only alone."""
    return {n for n in names if n.endswith("_total") or n + "_total" not in names}


def kv_evidence(before: list[Sample], after: list[Sample]) -> dict:
    kv_names = counter_names({n for n, labels, _ in after if is_external_kv(n, dict(labels))})
    nixl_names = counter_names({n for n, _, _ in after if is_nixl_failure(n)})

    def ext_kv(name, labels):
        return name in kv_names and is_external_kv(name, labels)

    def nixl_fail(name, labels):
        return name in nixl_names

    kv = _counter_total(after, ext_kv) - _counter_total(before, ext_kv)
    nf = _counter_total(after, nixl_fail) - _counter_total(before, nixl_fail)
    return {"external_kv_prompt_tokens": kv, "kv_metric_present": bool(kv_names),
            "nixl_failed_transfers": nf, "nixl_fail_metrics": sorted(nixl_names),
            "kv_transfer_observed": kv > 0}


def selected(samples: list[Sample], select: dict[str, list[str]] | None) -> list[Sample]:
    """Samples whose labels take one of the allowed values (one endpoint can carry several slots)."""
    if not select:
        return samples
    return [s for s in samples if all(dict(s[1]).get(k) in allowed for k, allowed in select.items())]


def diff(before_text: str, after_text: str, select: dict[str, list[str]] | None = None,
         phases: dict[str, dict[str, list[str]]] | None = None) -> dict:
    """Histogram deltas and KV evidence of the selected series; with `phases` (name -> label
    selection, e.g. the prefill and the decode engines), each phase's histograms on their own."""
    before, after = parse(before_text), parse(after_text)
    b, a = selected(before, select), selected(after, select)
    out = {"histograms": histogram_deltas(b, a), "kv": kv_evidence(b, a)}
    if phases:
        out["phases"] = {name: histogram_deltas(selected(before, sel), selected(after, sel))
                         for name, sel in phases.items()}
    return out


class Source(NamedTuple):
    url: str
    phase: str | None   # the phase whose engines this endpoint exports ("prefill"/"decode"), if it is one phase


def sources(metrics_url: str | None) -> list[Source]:
    """`metrics_url` is one URL, or several separated by commas, each optionally tagged with the
    phase of the engines it exports as a URL fragment: `http://10.0.3.7:8080/metrics#decode`.
    Several exist where each node exports only its own processes (Ray's per-node metrics agent on
    Kubernetes: every worker pod of the slot is one source)."""
    out = []
    for part in (metrics_url or "").split(","):
        url, _, phase = part.strip().partition("#")
        if url:
            out.append(Source(url, phase or None))
    return out


def diff_sources(before: dict[str, str], after: dict[str, str], phase_of: dict[str, str | None],
                 select: dict[str, list[str]] | None = None) -> dict:
    """`diff` over several endpoints (url -> text). A source only in `after` is new (a replaced
    engine: its series start from zero); one only in `before` is gone and left out of both sides.
    Tagged sources give the per-phase split."""
    parsed_before = {u: parse(t) for u, t in before.items()}
    b: list[Sample] = []
    a: list[Sample] = []
    phases: dict[str, tuple[list[Sample], list[Sample]]] = {}
    for url, text in after.items():
        samples, earlier = parse(text), parsed_before.get(url, [])
        b += earlier
        a += samples
        if (phase := phase_of.get(url)):
            pb, pa = phases.setdefault(phase, ([], []))
            pb += selected(earlier, select)
            pa += selected(samples, select)
    out = {"histograms": histogram_deltas(selected(b, select), selected(a, select)),
           "kv": kv_evidence(selected(b, select), selected(a, select))}
    if phases:
        out["phases"] = {name: histogram_deltas(pb, pa) for name, (pb, pa) in sorted(phases.items())}
    return out


class MetricsSource(Protocol):
    """Where a run's server figures come from: the direct scrape (`Scraper`) or a Prometheus that
    scrapes the engines (validation/prometheus.py). Both give the same ServerMetrics; a source that
    cannot measure the window says why in `error` (the gate then fails closed)."""

    def open(self, waited_s: float = 0.0) -> float:
        """Waits until everything sent so far is in the window's baseline; returns the window's start
        (unix s). `waited_s`: how long the caller has already waited since its last request."""
        ...

    def window(self, start: float, end: float, requests_ok: int = 0) -> ServerMetrics:
        """Figures of the load that ran from `start` (open's answer) to `end` (unix seconds)."""
        ...


# Ray exports each worker's metrics every metrics_report_interval_ms (default 10 s; measured on the
# local stack: a request showed up in /metrics 10.4 s after it finished).
RAY_METRICS_LAG_S = 10.0
# ...read by every Ray process from this environment variable (RAY_<name>; floor 1 s:
# ray/_private/telemetry/open_telemetry_metric_recorder.py, which mirrors src/ray/stats/stats.h).
RAY_METRICS_INTERVAL_ENV = "RAY_metrics_report_interval_ms"


def ray_export_lag_s(interval_ms: int | None) -> float:
    """How stale Ray's exported metrics can be at `interval_ms` (None: Ray's default): the interval
    plus a quarter, as measured at the default (10.4 s), never under Ray's 1 s floor."""
    if interval_ms is None:
        return RAY_METRICS_LAG_S
    return max(interval_ms, 1000) / 1000 * 1.25


class Scraper:
    """before() ... after() around a run; tolerant: a failed scrape is recorded, not raised.

    `lag_s`: how stale the endpoint's figures can be. Without waiting it out, requests sent before
    the run (compat, warmup) land inside the window and the run's own requests miss it: a 13 s
    run on Ray once showed no requests and no KV transfer at all."""

    def __init__(self, url: str | None, select: dict[str, list[str]] | None = None,
                 phases: dict[str, dict[str, list[str]]] | None = None, lag_s: float = 0.0):
        self.url = url
        self.select, self.phases, self.lag_s = select, phases, lag_s
        self.sources = sources(url)
        self._before: str | None = None
        self._befores: dict[str, str] = {}
        self.error: str | None = None
        # url -> text of the before and the last after scrape (validation/phase_load.py reads them)
        self.before_texts: dict[str, str] | None = None
        self.after_texts: dict[str, str] | None = None

    @property
    def _multi(self) -> bool:
        return len(self.sources) > 1 or any(s.phase for s in self.sources)

    def before(self) -> None:
        if self.url:
            time.sleep(self.lag_s)  # everything sent so far is exported before the window opens
            if self._multi:
                for src in self.sources:
                    try:
                        self._befores[src.url] = scrape(src.url)
                    except Exception as e:  # noqa: BLE001
                        self.error = f"before scrape of {src.url}: {e}"
                self._before = "" if self._befores else None
                self.before_texts = dict(self._befores)
                return
            try:
                self._before = scrape(self.url)
                self.before_texts = {self.url: self._before}
            except Exception as e:  # noqa: BLE001
                self.error = f"before scrape: {e}"

    def _diff(self, url: str) -> tuple[dict, list[str]]:
        if not self._multi:
            text = scrape(url)
            self.after_texts = {url: text}
            return diff(self._before or "", text, self.select, self.phases), []
        after, failed = {}, []
        for src in self.sources:
            try:
                after[src.url] = scrape(src.url)
            except Exception as e:  # noqa: BLE001 - a replaced pod's address answers no more
                failed.append(f"{src.url}: {e}")
        if not after:
            raise RuntimeError("; ".join(failed))
        self.after_texts = after
        return diff_sources(self._befores, after, {s.url: s.phase for s in self.sources}, self.select), failed

    def after(self, requests_ok: int = 0) -> dict | None:
        """Scrapes until each phase's engines have recorded `requests_ok` first tokens, or 3 x lag_s."""
        if not self.url:
            return None
        if self._before is None:
            return {"error": self.error or "no before scrape", "url": self.url}
        deadline = time.monotonic() + 3 * self.lag_s
        while True:
            try:
                res, failed = self._diff(self.url)
            except Exception as e:  # noqa: BLE001
                return {"error": f"after scrape: {e}", "url": self.url}
            recorded = _recorded(res)
            if recorded >= requests_ok or time.monotonic() >= deadline:
                # short of requests_ok: replicas restarted (new series the selection misses) or the
                # export is later than lag_s; the figures then cover part of the run only
                res.update(url=self.url, requests_seen=recorded, requests_ok=requests_ok)
                if failed:
                    res["unreachable"] = failed
                return res
            time.sleep(1.0)


    def open(self, waited_s: float = 0.0) -> float:
        """MetricsSource: the before scrape (after waiting out `lag_s`)."""
        self.before()
        return time.time()

    def window(self, start: float, end: float, requests_ok: int = 0) -> ServerMetrics:
        """MetricsSource: the diff from the before scrape to one now (which waits for the figures to
        catch up with the load that ended at `end`)."""
        from validation.reports.bench import ServerMetrics

        res = self.after(requests_ok)
        return ServerMetrics.model_validate(res if res is not None else {"error": "no metrics URL given"})


def _recorded(res: dict) -> float:
    """First tokens recorded in the window by the phase that saw fewest (every phase sees each request)."""
    groups = list((res.get("phases") or {}).values()) or [res["histograms"]]
    return min((g.get("time_to_first_token_seconds") or {}).get("count") or 0 for g in groups)


# client metric -> the server histogram that measures the same phase
CLIENT_SERVER = (("ttft_ms", "time_to_first_token_seconds"), ("itl_ms", "inter_token_latency_seconds"),
                 ("tpot_ms", "request_time_per_output_token_seconds"))


def side_by_side(bench: BenchReport) -> list[dict[str, Any]]:
    """Client vs server p50/p90/p99 per phase for one run. Prometheus histograms allow no
    per-request join, so the run-window deltas stand side by side; client minus server is the
    client + network overhead (server quantiles are interpolated inside buckets)."""
    hists = bench.server.histograms if bench.server is not None else {}
    rows = []
    for key, hist in CLIENT_SERVER:
        h = hists.get(hist)
        if not h or not h.count:
            continue
        c = getattr(bench, key)
        row: dict[str, Any] = {"phase": key[:-3], "metric": h.metric, "server_count": h.count}
        for q in ("p50", "p90", "p99"):
            row[f"client_{q}"], row[f"server_{q}"] = getattr(c, q) if c is not None else None, getattr(h, f"{q}_ms")
        rows.append(row)
    return rows
