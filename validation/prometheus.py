"""Server-side figures of a measurement window from PromQL, for clusters where a Prometheus already
scrapes the engines (the rendered PodMonitor, kustomize/components/monitoring): the same typed
ServerMetrics as the direct scrape's diff (validation/server_metrics.py), so the gate cannot tell
which source a report came from.

Every figure is `increase(<counter>[<range>])` evaluated at the window's end, summed over the
candidate's series (and by `le` for buckets, by phase where the series carry a phase label):
- increase(), not rate(): the gate wants how many requests fell in each bucket during the run, not
  a per-second rate; rate() would only be multiplied back by the range. Both come from the same
  code (promql/functions.go extrapolatedRate), so neither is more exact.
- increase() adjusts for counter resets ("Breaks in monotonicity (such as counter resets due to
  target restarts) are automatically adjusted for", docs/querying/functions.md; extrapolatedRate
  adds the last value before every drop): an engine that restarts mid-run keeps what it counted
  before, where the direct scrape's after-minus-before goes wrong.
- sum by (le): a histogram's buckets are cumulative counters, one series per le and per engine;
  summing their increases per le merges the engines into one histogram of the run (the sum of
  cumulative counts is cumulative), which is what histogram_quantile() interpolates in and what
  server_metrics.histogram_entry does here. Summing quantiles or averaging them would be wrong.
- increase() extrapolates to the range's edges (the same function): counts come out non-integer,
  up to about one scrape interval / window above the true count (1 s / 30 s: 3 %). Quantiles and
  means are ratios of counts from the same scrapes, so the factor cancels; the tests bound both.
- increase() needs 2 samples of a series inside the range, else the series is dropped: a run
  shorter than 2 scrape intervals cannot be measured, and says so instead of showing nothing.

The range ends `lag_s` (how stale the engines' export is: Ray every 10 s) plus one scrape interval
after the load, so the last requests have been exported and scraped; it starts one scrape interval
before the window opened, where `open` made sure a sample of the quiet state before the load lies.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from typing import Any

from validation import server_metrics as sm
from validation.reports.bench import ServerMetrics

_PREFIX_RE = "|".join(re.escape(p) for p in sm.PREFIXES)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class PrometheusError(RuntimeError):
    """Prometheus could not answer: unreachable, an HTTP error or a failed query (the reason is the message)."""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(select: dict[str, str], name_regex: str | None = None) -> str:
    """`{__name__=~"...", label="value", ...}`: the series of `select` (label -> exact value)."""
    parts = ([f"__name__=~{_quote(name_regex)}"] if name_regex else []) + \
        [f"{k}={_quote(v)}" for k, v in sorted(select.items())]
    return "{" + ",".join(parts) + "}"


def _names_regex(names: set[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


def _duration_s(text: str) -> float | None:
    m = _DURATION.match(text or "")
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else None


class Prometheus:
    """The parts of Prometheus' HTTP API used here (docs/querying/api.md): instant queries, series, targets."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _get(self, path: str, params: list[tuple[str, str]]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout_s) as r:  # noqa: S310 - the spec's URL
                body = json.loads(r.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as e:   # a bad query answers 400 with {"status": "error", "error": ...}
            try:
                body = json.loads(e.read().decode("utf-8", "replace"))
            except ValueError:
                raise PrometheusError(f"Prometheus at {self.url} answered HTTP {e.code} to {path}") from e
        except (OSError, ValueError) as e:
            raise PrometheusError(f"Prometheus at {self.url} unreachable: {e}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": labels, "value": [t, "v"]}]."""
        data = self._get("/api/v1/query", [("query", promql), ("time", f"{at:.3f}")])
        if data.get("resultType") != "vector":
            raise PrometheusError(f"Prometheus at {self.url}: {promql} gave a {data.get('resultType')}, not a vector")
        return data["result"]

    def series(self, matchers: list[str], start: float, end: float) -> list[dict[str, str]]:
        params = [("match[]", m) for m in matchers] + [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
        return self._get("/api/v1/series", params)

    def scrape_interval(self, select: dict[str, str]) -> float | None:
        """The longest scrape interval of the active targets whose labels include `select`; None when
        none does (`scrapeInterval` of /api/v1/targets; the target's `__scrape_interval__` label before it)."""
        targets = self._get("/api/v1/targets", [("state", "active")]).get("activeTargets") or []
        found = [_duration_s(t.get("scrapeInterval") or t.get("discoveredLabels", {}).get("__scrape_interval__", ""))
                 for t in targets if all((t.get("labels") or {}).get(k) == v for k, v in select.items())]
        return max((f for f in found if f), default=None)


class PrometheusSource:
    """A validation.server_metrics.MetricsSource reading a Prometheus that scrapes the engines.

    `select`: labels every series of this slot carries (Kubernetes: the namespace and
    `pdops_dev_colour`, which the PodMonitor's podTargetLabels copy from the pods);
    `phase_label`: the label naming each engine's phase (`pdops_dev_phase`), for per-phase figures."""

    def __init__(self, url: str, select: dict[str, str], phase_label: str | None = None, lag_s: float = 0.0,
                 timeout_s: float = 10.0, settle_s: float = 0.5):
        self.url, self.select, self.phase_label, self.lag_s = url, dict(select), phase_label, lag_s
        self.api = Prometheus(url, timeout_s)
        self.settle_s = settle_s   # a scrape's samples are queryable once it ends: local scrapes take ~10 ms

    def _interval(self) -> float:
        interval = self.api.scrape_interval(self.select)
        if interval is None:
            raise PrometheusError(f"Prometheus at {self.url} scrapes no target with labels {self.select} "
                                  "(is the PodMonitor applied with its podTargetLabels?)")
        return interval

    def open(self, waited_s: float = 0.0) -> float:
        """Waits out the engines' lag and one scrape interval, so that Prometheus holds a sample of the
        state before the load: the range then starts one interval before the window (`window`).
        Without it the first sample inside the range already counted the first requests (measured:
        a restart test lost 10 of 20 requests). Errors wait for `window` to report them."""
        try:
            interval = self._interval()
        except PrometheusError:
            interval = 0.0
        time.sleep(max(0.0, self.lag_s + interval + self.settle_s - waited_s))
        return time.time()

    def window(self, start: float, end: float, requests_ok: int = 0) -> ServerMetrics:
        """Figures of the load run from `start` (`open`'s answer) to `end` (unix seconds). Waits until
        Prometheus has scraped what the engines exported about it; every failure is a ServerMetrics
        with `error`."""
        try:
            return self._window(start, end, requests_ok)
        except PrometheusError as e:
            return ServerMetrics(error=str(e), url=self.url, requests_ok=requests_ok)

    def _window(self, start: float, end: float, requests_ok: int) -> ServerMetrics:
        if not self.select:   # would sum every slot's engines, stable and candidate alike
            raise PrometheusError("no labels select this slot's engines in Prometheus (the target gives none: "
                                  "only the Kubernetes target does)")
        interval = self._interval()
        if end - start < 2 * interval:
            raise PrometheusError(f"the measurement window ({end - start:.1f} s) is shorter than 2 scrape "
                                  f"intervals ({interval:g} s): increase() needs 2 samples inside it; run "
                                  "longer or scrape more often")
        at = end + self.lag_s + interval + self.settle_s
        time.sleep(max(0.0, at + self.settle_s - time.time()))
        first = start - interval   # the baseline sample `open` waited for is in the range
        found = self._names(first, at)
        if not found:
            raise PrometheusError(f"Prometheus at {self.url} has no vLLM series with labels {self.select} "
                                  f"from {first:.0f} to {at:.0f}")
        rng = f"{max(1, round((at - first) * 1000))}ms"
        totals, phases = self._histograms(found, rng, at)
        if not totals:
            raise PrometheusError(f"increase() over {rng} gave no histogram with labels {self.select}: fewer than "
                                  "2 samples of each series inside the window")
        out: dict[str, Any] = {"histograms": totals, "kv": self._kv(found, rng, at), "url": self.url,
                               "requests_ok": requests_ok}
        if phases:
            out["phases"] = phases
        groups = list(phases.values()) or [totals]
        out["requests_seen"] = min((g.get("time_to_first_token_seconds") or {}).get("count") or 0 for g in groups)
        return ServerMetrics.model_validate(out)

    def _names(self, start: float, end: float) -> dict[str, set[str]]:
        """Which metric names the slot's series have in the window: histogram short name -> full
        names (vllm:*, ray_vllm_*), plus "kv" and "nixl"."""
        hist = f"({_PREFIX_RE})({'|'.join(sm.HISTOGRAMS)})_count"
        kv = f"({_PREFIX_RE})({'|'.join(sm.KV_COUNTERS)})"
        matchers = [selector(self.select, hist), selector({**self.select, "source": "external_kv_transfer"}, kv),
                    selector(self.select, "(?i).*nixl.*fail.*")]
        found: defaultdict[str, set[str]] = defaultdict(set)
        for labels in self.api.series(matchers, start, end):
            name = labels["__name__"]
            short = next((h for h in sm.HISTOGRAMS if name.endswith(h + "_count")), None)
            if short:
                found[short].add(name[: -len("_count")])
            elif sm.is_external_kv(name, labels):
                found["kv"].add(name)
            elif sm.is_nixl_failure(name):
                found["nixl"].add(name)
        return found

    def _sum(self, select: dict[str, str], names: set[str], rng: str, at: float,
             by: list[str]) -> dict[tuple[str, ...], float]:
        """The sum by (`by`) of increase(...[rng])) of the series named `names` with labels `select`."""
        inner = f"increase({selector(select, _names_regex(names))}[{rng}])"
        promql = f"sum by ({', '.join(by)}) ({inner})" if by else f"sum({inner})"
        return {tuple(r["metric"].get(b, "") for b in by): float(r["value"][1]) for r in self.api.query(promql, at)}

    def _histograms(self, found: dict[str, set[str]], rng: str,
                    at: float) -> tuple[dict[str, dict], dict[str, dict[str, dict]]]:
        """Every histogram over the whole slot, and per phase where the series carry `phase_label`."""
        by = [self.phase_label] if self.phase_label else []
        totals: dict[str, dict] = {}
        phases: defaultdict[str, dict[str, dict]] = defaultdict(dict)
        for short in sm.HISTOGRAMS:
            bases = found.get(short)
            if not bases:
                continue
            buckets = self._sum(self.select, {b + "_bucket" for b in bases}, rng, at, ["le", *by])
            sums = self._sum(self.select, {b + "_sum" for b in bases}, rng, at, by)
            counts = self._sum(self.select, {b + "_count" for b in bases}, rng, at, by)
            if not buckets and not counts:   # every series had fewer than 2 samples in the range
                continue
            metric = sorted(bases)[0]
            totals[short] = sm.histogram_entry(metric, _cumulative(buckets), sum(sums.values()), sum(counts.values()))
            for phase in sorted({key[1] for key in buckets if len(key) > 1} - {""}):
                phases[phase][short] = sm.histogram_entry(metric, _cumulative(buckets, phase), sums.get((phase,), 0.0),
                                                       counts.get((phase,), 0.0))
        return totals, dict(phases)

    def _kv(self, found: dict[str, set[str]], rng: str, at: float) -> dict[str, Any]:
        """KV evidence as server_metrics.kv_evidence gives it: prompt tokens that arrived by KV transfer,
        failed NIXL transfers (each counter once: server_metrics.counter_names)."""
        kv_names, nixl_names = sm.counter_names(found.get("kv", set())), sm.counter_names(found.get("nixl", set()))
        kv_select = {**self.select, "source": "external_kv_transfer"}
        kv = sum(self._sum(kv_select, kv_names, rng, at, []).values()) if kv_names else 0.0
        nf = sum(self._sum(self.select, nixl_names, rng, at, []).values()) if nixl_names else 0.0
        return {"external_kv_prompt_tokens": kv, "kv_metric_present": bool(kv_names), "nixl_failed_transfers": nf,
                "nixl_fail_metrics": sorted(nixl_names), "kv_transfer_observed": kv > 0}


def _cumulative(buckets: dict[tuple[str, ...], float], phase: str | None = None) -> list[tuple[float, float]]:
    """(le, count) sorted by le from {(le, phase?): increase}; one phase's or all of them."""
    out: defaultdict[float, float] = defaultdict(float)
    for key, value in buckets.items():
        if phase is None or key[1:] == (phase,):
            out[float(key[0])] += value   # float("+Inf") is inf; "1" and "1.0" are one bucket
    return sorted(out.items())
