"""BenchReport: one benchmark run (validation/bench.py `run_bench`, `pdops bench --json`, RUN/bench-*.json).

Client quantiles per metric (validation/metrics.py), prompt/output length checks, goodput, the
client's health, the server's histogram deltas per phase and KV evidence (validation/server_metrics.py),
per-request samples for the gate's intervals (validation/stats.py), and the run's cost
(validation/cost.py). Figures that were not measured are null with a reason in `missing`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from validation.reports.base import ReportModel, unexplained


class Quantiles(ReportModel):
    """A latency (ms) or count summary; all null when nothing was measured (count 0)."""

    count: int | None = None
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class ProfileSpec(ReportModel):
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    distribution: str | None = None
    spread: float | None = None


class Load(ReportModel):
    mode: str | None = None           # closed | open | trace
    concurrency: int | None = None
    rate: float | None = None
    poisson: bool | None = None
    requests: int | None = None
    duration_s: float | None = None
    warmup: int | None = None
    workers: int | None = None
    trace: str | None = None
    ramp_s: float | None = None       # the load rose over this long instead of starting as a burst


class LengthMismatch(ReportModel):
    index: int | None = None
    expected: int | None = None
    got: int | None = None


class Lengths(ReportModel):
    checked: int | None = None
    output_mismatches: int | None = None
    output_mismatch_samples: list[LengthMismatch] = Field(default_factory=list)
    prompt_ratio_mean: float | None = None    # prompt tokens served / requested
    prompt_mismatch: bool | None = None
    prompts_from: str | None = None


class Machine(ReportModel):
    cores: int | None = None
    load_avg_1m: float | None = None
    system_cpu_percent: float | None = None
    client_nice: int | None = None


class LoopLag(ReportModel):
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    samples: int | None = None


class CpuPercent(ReportModel):
    mean: float | None = None
    max: float | None = None
    samples: int | None = None


class ClientHealth(ReportModel):
    loop_lag_ms: LoopLag | None = None
    cpu_percent: CpuPercent | None = None
    client_bottleneck: bool = False
    reasons: list[str] = Field(default_factory=list)
    machine: Machine | None = None
    workers: int | None = None
    per_worker: list[ClientHealth] | None = None

    def starved(self) -> str | None:
        """Why the run is void because its client was starved (its reasons), or None when the client kept up."""
        return ("; ".join(self.reasons) or "client_health.client_bottleneck") if self.client_bottleneck else None


class Histogram(ReportModel):
    """A server histogram's delta over the run window (quantiles interpolated inside buckets)."""

    metric: str | None = None
    count: float | None = None
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


class KvEvidence(ReportModel):
    external_kv_prompt_tokens: float | None = None
    kv_metric_present: bool | None = None
    nixl_failed_transfers: float | None = None
    nixl_fail_metrics: list[str] = Field(default_factory=list)
    kv_transfer_observed: bool | None = None


class ServerMetrics(ReportModel):
    """The engines' own figures; with `error` (a failed scrape) the rest is absent."""

    histograms: dict[str, Histogram] = Field(default_factory=dict)
    kv: KvEvidence | None = None
    phases: dict[str, dict[str, Histogram]] | None = None    # prefill / decode engines on their own
    url: str | None = None
    requests_seen: float | None = None
    requests_ok: int | None = None
    unreachable: list[str] | None = None
    error: str | None = None


class Samples(ReportModel):
    """Per-request samples (ms): ttft and tpot one per request, itl the gaps with `itl_counts` per request;
    a baseline (validation.verdicts.baseline) keeps `itl_means` instead of the gaps."""

    ttft: list[float] | None = None
    tpot: list[float] | None = None
    itl: list[float] | None = None
    itl_counts: list[int] | None = None
    itl_means: list[float] | None = None
    truncated: dict[str, int] | None = None
    # every measured (non-warm-up) request in send order, 1 ok / 0 error, never truncated: the gate's
    # error counts (validation/error_rates.py) are recomputed from these when present
    outcomes: list[int] | None = None
    outcome_block: list[int] | None = None    # each outcome's block (interleaved runs), aligned with outcomes
    # each successful request's block (interleaved runs), aligned with ttft/tpot/itl_counts/itl_means:
    # the gate pairs candidate block k with baseline block k (validation/judge.py); None = one block
    block: list[int] | None = None
    # tpot has no entry for a request whose TPOT was not measured (one token, or a stream the server
    # sent in one read): tpot's own block labels, aligned with tpot (validation/interleave.py labelled)
    tpot_block: list[int] | None = None


class GoodputSlo(ReportModel):
    ttft_ms: float | None = None
    tpot_ms: float | None = None


class VoidPair(ReportModel):
    """A block pair dropped from the comparison: one of its blocks could not be measured fairly."""

    pair: int                         # the pair's block index (Samples.block)
    side: str                         # candidate | stable: the block that failed
    reason: str


class Interleaved(ReportModel):
    """This side's run was measured interleaved with the other slot's (validation/interleave.py)."""

    blocks: int                       # blocks per side, as planned
    order: str                        # e.g. CSSCSCCS: C candidate, S stable (baseline), pair by pair
    # the seed of the order (which side went first in each pair); a later look starting at block f
    # drew its order from seed + 1000 * f (workflows/pipeline/paired.py)
    seed: int | None = None
    pairs: int | None = None          # pairs measured and kept (blocks - void), what the gate pairs
    first_block: int = 0              # the first pair's block index (a later look continues the count)
    void: list[VoidPair] = Field(default_factory=list)
    per_block: list[dict[str, Any]] | None = None   # each kept block's own summary


class StoppedEarly(ReportModel):
    """The measurement stopped before its plan: a check's failure was already beyond doubt at an interim
    look (slo.statistics.stop_early; validation/interim.py). The gate fails `stopped_early` with `reason`."""

    after: int                        # requests measured when it stopped (the candidate's, all blocks so far)
    planned: int                      # requests the load planned (this side); 0: a timed load (duration_s)
    block: int | None = None          # interleaved: the last candidate block measured (1-based)
    blocks: int | None = None         # interleaved: the blocks planned
    checks: list[str] = Field(default_factory=list)   # the checks beyond doubt
    level: float                      # the one-sided interim level (judge.Budget.interim_alpha)
    reason: str


class BenchReport(ReportModel):
    kind: Literal["bench"] = "bench"
    base_url: str | None = None
    model: str | None = None
    profile: str | None = None
    profile_spec: ProfileSpec | None = None
    load: Load = Field(default_factory=Load)
    started_unix: float | None = None
    requests_total: int | None = None
    requests_ok: int | None = None
    errors: int | None = None
    error_rate: float | None = None
    error_samples: list[str] = Field(default_factory=list)
    wall_s: float | None = None
    ttft_ms: Quantiles | None = None
    itl_ms: Quantiles | None = None
    tpot_ms: Quantiles | None = None
    e2e_ms: Quantiles | None = None
    ttft_from_scheduled_ms: Quantiles | None = None    # open loop: from each request's scheduled send
    e2e_from_scheduled_ms: Quantiles | None = None
    tokens_per_chunk: Quantiles | None = None
    itl_level: Literal["token", "chunk"] | None = None
    output_tokens: Quantiles | None = None
    input_tokens: Quantiles | None = None
    requests_missing_usage: int | None = None
    # successful requests without a TPOT sample, by reason (validation/metrics.py decode_timing): one_token,
    # no_usage, one_read, decode_not_timed. None: a report from before the count (the gate then takes every
    # request as multi-token, validation/gate.py tpot_coverage)
    tpot_unmeasured: dict[str, int] | None = None
    request_throughput_rps: float | None = None
    output_token_throughput_tps: float | None = None
    input_token_throughput_tps: float | None = None
    goodput_requests: int | None = None
    goodput_rps: float | None = None
    slo_attainment: float | None = None
    goodput_slo: GoodputSlo | None = None
    client_health: ClientHealth = Field(default_factory=ClientHealth)
    lengths: Lengths | None = None
    server: ServerMetrics | None = None
    samples: Samples | None = None
    cost: Cost | None = None
    looks: list[dict[str, Any]] | None = None    # slo.statistics extend: each look's own summary
    interleaved: Interleaved | None = None       # slo.vs_stable.measure: live
    stopped_early: StoppedEarly | None = None    # slo.statistics.stop_early: the load stopped at an interim look
    # slo.remeasure_void: why each earlier run of this load was void (its client starved) and measured again
    void_attempts: list[str] = Field(default_factory=list)
    # Phase balance verdict (issue 16's companion work, helper `balance`): its typed model goes here.
    balance: dict[str, Any] | None = None
    missing: dict[str, str] = Field(default_factory=dict)   # dotted path of a null figure -> why

    # null by design: settings of the run, not figures it measured
    BY_DESIGN: ClassVar[tuple[str, ...]] = ("load", "goodput_slo", "profile_spec", "samples", "looks", "interleaved",
                                           "balance", "stopped_early",
                                           "cost", "tpot_unmeasured",
                 "ttft_from_scheduled_ms", "e2e_from_scheduled_ms", "base_url", "model", "profile", "started_unix",
                 "client_health.per_worker", "client_health.workers", "lengths.output_mismatch_samples",
                                           "server.error", "server.unreachable", "server.phases", "server.url")

    @model_validator(mode="after")
    def _explain(self) -> BenchReport:
        """Every null figure gets a reason: the producer's, else the most specific one known here."""
        data = self.model_dump(mode="json", exclude={"missing", "samples"})
        for path in unexplained(data, self.missing, self.BY_DESIGN):
            head = path.split(".")[0]
            if head == "server" and self.server is None:
                self.missing["server"] = "no --metrics-url: the server's metrics were not scraped"
            elif head == "server" and self.server is not None and self.server.error:
                self.missing["server"] = f"server metrics not scraped: {self.server.error}"
            elif (head in type(self).model_fields and isinstance(getattr(self, head), Quantiles)
                  and getattr(self, head).count == 0):
                self.missing[head] = "no sample: no successful request measured it"
            else:
                self.missing[path] = "not measured: absent from the producer's report"
        return self


from validation.reports.cost import Cost  # noqa: E402  (cost's models are their own concern)

BenchReport.model_rebuild()
