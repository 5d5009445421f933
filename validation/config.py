"""What a release says about its own validation: SLO gates and load, kept in git in release.yaml.

The release spec (workflows/spec/release.py) embeds these models; `pdops gate`, `pdops bench` and
`pdops compat` read them, so a threshold has exactly one home.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Bounds are sanity limits, not tuning advice: a typo such as 10**18 requests or an .inf
# threshold is refused with the field's name instead of hanging a release or gating on nothing.
Ms = Annotated[float, Field(gt=0, le=3_600_000, allow_inf_nan=False)]           # up to an hour
Factor = Annotated[float, Field(gt=0, le=1_000, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrefillSLO(_Strict):
    """Time to first token: queue + prefill + KV transfer + first decode step."""

    ttft_p90_ms: Ms | None = None
    ttft_p99_ms: Ms | None = None


class DecodeSLO(_Strict):
    """Per-token latency after the first token: ITL pooled over chunks, TPOT per request."""

    itl_p90_ms: Ms | None = None
    itl_p99_ms: Ms | None = None
    tpot_p90_ms: Ms | None = None
    tpot_p99_ms: Ms | None = None


class VsStable(_Strict):
    """Candidate at most this factor times the baseline (the stable release, same size, same load, same
    window), per named quantile: `ttft_p90: 1.1` compares the candidate's p90 TTFT with the baseline's,
    block k against block k (validation/judge.py vs_baseline; a p99 is its own check). Passes when the
    ratio's upper bound is within the factor, fails when its lower bound is beyond it."""

    ttft_p90: Factor | None = None
    tpot_p90: Factor | None = None
    itl_p90: Factor | None = None
    ttft_p99: Factor | None = None
    tpot_p99: Factor | None = None
    itl_p99: Factor | None = None
    # $ per 1,000 requests (validation/cost.py) at most this factor times the stable release's.
    cost: Factor | None = None
    # live: a baseline of the stable release (Target.baseline_server; never the users' slot) measured
    # under the same loads in `blocks` block pairs with the candidate, seeded random order per pair
    # (validation/interleave.py), so drift over days and over minutes hits both sides; where none can
    # run, nothing is compared (without_baseline). recorded: the baseline kept at promote (half the load time).
    measure: Literal["live", "recorded"] = "live"
    # Block pairs per load. The comparison's variance is estimated from the pairs, so with few of them
    # the interval is wide (t(k-1)); with 5 % block-to-block noise, queueing correlation and bursts,
    # 48 pairs of 50 requests catch a +15 % p90 regression at prod's 33 checks (scripts/bench_gate_sim.py,
    # docs/gate.md#error-rates; `pdops plan-load` plans it from a pilot). Fewer than 2 pairs: no interval.
    blocks: Annotated[int, Field(ge=1, le=256)] = 48
    # What a load with no baseline run to compare with does (no baseline measured: a first release,
    # no room for one; or one measured at another profile/load). fail: the vs_stable checks of that
    # load fail, so nothing is promoted on a comparison that was never made. absolute_only: they are
    # reported `skipped` and the candidate is promoted on the absolute SLOs alone; the decision's
    # first line says "gated on absolute SLOs only: <why>" (validation/gate.py no_baseline).
    without_baseline: Literal["fail", "absolute_only"] = "fail"


Rate = Annotated[float, Field(gt=0, le=0.5, allow_inf_nan=False)]


class Statistics(_Strict):
    """The decision's error rates (validation/judge.py; docs/gate.md#error-rates).

    `false_rollback`: the rate at which a candidate that is within every limit is rolled back, for the
    WHOLE decision (all checks of all loads together): split over the planned checks (Bonferroni), each
    check's share is the level at which it may fail. `missed_regression`: the rate at which a candidate
    at or beyond a limit is promoted; it is each check's pass level (a release is promoted only when
    every check passes, so this holds for the decision too) and what `pdops plan-load` plans power for.
    Every check is pass, fail or inconclusive; `inconclusive` says what an unproven check does: fail
    (roll back); extend (run each unproven load again, up to `max_looks` runs in all, then fail; both
    rates are split over the looks); point_estimate (decide by the point estimate: for runs too small
    to prove anything, e.g. the tiny local model's 16 requests; every such check says so)."""

    false_rollback: Rate = 0.05
    missed_regression: Rate = 0.05
    inconclusive: Literal["fail", "extend", "point_estimate"] = "fail"
    max_looks: Annotated[int, Field(ge=1, le=10)] = 1
    # Interim looks during each load's measurement on the absolute SLO checks and the error tolerance
    # only (never vs_stable): a failure already beyond doubt at a very strict level (Haybittle-Peto)
    # stops the measurement and rolls back, with the report saying when and why. The looks spend
    # validation/interim.py INTERIM_SHARE of false_rollback (judge.budget accounts for it), so the
    # decision's stated rates hold. false: every load runs its whole plan (docs/gate.md#stopping-early).
    stop_early: bool = True

    @property
    def confidence(self) -> float:
        """1 - false_rollback (the level of the error-count tests before their budget share; compatibility)."""
        return 1 - self.false_rollback

    @property
    def power(self) -> float:
        """1 - missed_regression (compatibility)."""
        return 1 - self.missed_regression

    @model_validator(mode="after")
    def _looks(self) -> Statistics:
        if self.inconclusive == "extend" and self.max_looks < 2:
            raise ValueError("inconclusive: extend needs max_looks >= 2 (the first run counts as one look)")
        if self.inconclusive != "extend" and self.max_looks != 1:
            raise ValueError(f"max_looks {self.max_looks} only applies with inconclusive: extend "
                             "(set inconclusive: extend, or drop max_looks)")
        return self


class SLO(_Strict):
    prefill: PrefillSLO = PrefillSLO()
    decode: DecodeSLO = DecodeSLO()
    max_error_rate: Fraction = 0.0
    # Goodput (DistServe): requests/s that meet both goodput_ttft_ms and goodput_tpot_ms.
    goodput_ttft_ms: Ms | None = None
    goodput_tpot_ms: Ms | None = None
    min_goodput_rps: Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)] | None = None
    min_slo_attainment: Fraction | None = None
    kv_transfer: Literal["required", "ignored"] = "required"
    # required: a run whose load generator was starved (event-loop lag, CPU) is void. ignored: for a
    # machine where the harness must share its cores with the engines (overlays/local), whose
    # figures are reports anyway; the starvation is still shown in every report.
    client_health: Literal["required", "ignored"] = "required"
    # With client_health required: a load whose measurement came back void is measured again, at most this
    # many times, before the gate fails closed on it (workflows/pipeline/steps.py CandidateLoads.measure: a
    # void run is the tool's error, not the candidate's failure; Argo Rollouts' consecutiveErrorLimit). 1: a
    # passing noise (another pod's start on the node) costs one more run of the load instead of a rollback.
    remeasure_void: int = Field(1, ge=0, le=4)
    vs_stable: VsStable | None = None
    statistics: Statistics = Statistics()


class LoadProfile(_Strict):
    """One benchmark run of the release's validation: a named traffic profile at a load, or a trace
    of the team's own traffic replayed (validation/traces.py) with its own arrivals and lengths."""

    profile: Name = "balanced"
    # closed loop: this many requests in flight. Open loop: `rate` requests/s sent on schedule whatever
    # the server's speed (rate wins over concurrency), Poisson arrivals unless `arrival: uniform`;
    # latency is then also measured from each request's scheduled send (coordinated omission)
    concurrency: Annotated[int, Field(gt=0, le=4096)] | None = 4
    rate: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    arrival: Literal["poisson", "uniform"] = "poisson"
    # the load rises over this many seconds at the start of the run and of each interleaved block
    # instead of starting as a burst (validation/loadgen.py, validation/interleave.py); 0: a burst
    ramp_s: Annotated[float, Field(ge=0, le=3_600, allow_inf_nan=False)] = 1.0
    # 2400 per side, in slo.vs_stable.blocks blocks (48 of 50): what the whole decision's error rates
    # need with 5 % block-to-block noise and queueing correlation (scripts/bench_gate_sim.py,
    # docs/gate.md#error-rates); `pdops plan-load` plans it from a pilot run.
    requests: Annotated[int, Field(gt=0, le=1_000_000)] | None = 2400
    duration_s: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)] | None = None
    warmup_requests: int = Field(2, ge=0, le=10_000)
    # A trace file, relative to the overlay directory and inside the repository; `requests` caps it.
    trace: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_./-]+$")] | None = None
    trace_format: Literal["auto", "mooncake", "azure", "jsonl"] = "auto"
    time_scale: Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)] = 1.0   # 2 = replay twice as fast

    @model_validator(mode="before")
    @classmethod
    def _trace_sets_its_own_arrivals(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("trace") is not None:
            clash = [k for k in ("concurrency", "rate", "duration_s") if data.get(k) is not None]
            if clash:
                raise ValueError(f"a trace sets its own arrival times: remove {', '.join(clash)} "
                                 "(use time_scale to replay faster, requests to cap it)")
            data = {**data, "concurrency": None}
        return data


class CompatPolicy(_Strict):
    """Which compatibility cases must pass; others are reported but do not block promotion."""

    optional: list[Name] = Field([], max_length=64)
    api_key_required: bool = False


# A file in the repository, relative to the release.yaml that names it (checked to exist by
# validation.diff.spec_files when the spec is loaded).
RepoFile = Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]*$")]


class BalancePolicy(_Strict):
    """Phase balance (validation/balance.py, docs/adoption.md#phase-balance): when a phase counts as queueing,
    and whether an imbalance blocks. Defaults are NVIDIA Dynamo's load-based planner's scale-up
    thresholds (components/planner/src/dynamo/planner/defaults.py LoadPlannerDefaults)."""

    # requests waiting for capacity per engine, time-averaged over the run (prefill_queue_scale_up_threshold)
    queue_per_engine: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] = 5.0
    # mean KV-cache usage of the decode engines (decode_kv_scale_up_threshold)
    kv_usage: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9
    # an imbalanced run fails the gate (default: reported, with the advice, never blocking)
    block: bool = False


class Validation(_Strict):
    load: list[LoadProfile] = Field([LoadProfile()], min_length=1, max_length=16)
    compat: CompatPolicy = CompatPolicy()
    golden_prompts: int = Field(4, gt=0, le=64)
    golden_max_tokens: int = Field(16, gt=0, le=4096)
    # Longest wait for one validation request, first byte to last: a candidate that hangs
    # mid-stream costs the release this long per request, then counts as an error.
    request_timeout_s: Annotated[float, Field(gt=0, le=3_600, allow_inf_nan=False)] = 120.0
    # `pdops diff` in the release: the team's own scenarios (JSONL, one request body per line,
    # optional `name` and `expect`) run beside the built-in matrix against the single-engine
    # reference, and the known P/D divergences (YAML: case, reason, link) that do not block.
    scenarios: list[RepoFile] = Field([], max_length=32)
    known_divergences: RepoFile | None = None
    # Whether the release runs the differential suite where the target has a reference engine.
    diff: bool = True
    balance: BalancePolicy = BalancePolicy()
    # The single-engine reference golden tokens and the diff compare with: `rayservice`, the target's
    # own (Kubernetes: a short-lived RayService of one decode pod; local: a plain vLLM engine), or
    # `none` (both checks reported skipped, e.g. a cluster with no room for one more decode pod).
    reference: Literal["rayservice", "none"] = "rayservice"
