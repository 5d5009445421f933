"""What a release says about its own validation: SLO gates and load, kept in git in release.yaml.

The release spec (workflows/spec.py) embeds these models; `pdops gate`, `pdops bench` and
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
    """Candidate at most this factor times stable. With per-request samples of both (validation/stats.py):
    the Hodges-Lehmann shift ratio of the phase's latencies and its interval; pass when its upper
    bound is <= factor, fail when its lower bound is > factor. Without samples: the p90 ratio."""

    ttft_p90: Factor | None = None
    tpot_p90: Factor | None = None
    itl_p90: Factor | None = None
    # $ per 1,000 requests (validation/cost.py) at most this factor times the stable release's.
    cost: Factor | None = None
    # live: a baseline of the stable release (Target.baseline_server; never the users' slot) measured
    # under the same loads in `blocks` block pairs with the candidate, seeded random order per pair
    # (validation/interleave.py), so drift over days and over minutes hits both sides; where none can
    # run, nothing is compared (without_baseline). recorded: the baseline kept at promote (half the load time).
    measure: Literal["live", "recorded"] = "live"
    blocks: Annotated[int, Field(ge=1, le=32)] = 4
    # What a load with no baseline run to compare with does (no baseline measured: a first release,
    # no room for one; or one measured at another profile/load). fail: the vs_stable checks of that
    # load fail, so nothing is promoted on a comparison that was never made. absolute_only: they are
    # reported `skipped` and the candidate is promoted on the absolute SLOs alone; the decision's
    # first line says "gated on absolute SLOs only: <why>" (validation/gate.py no_baseline).
    without_baseline: Literal["fail", "absolute_only"] = "fail"


class Statistics(_Strict):
    """How sure the gate must be (validation/stats.py, docs/gate.md#a-gate-that-knows-how-sure-it-is).

    Every latency check is pass (proven within its limit at `confidence`), fail (proven beyond it)
    or inconclusive. `inconclusive` says what an unproven check does: fail (roll back); extend (run
    each unproven load again, up to `max_looks` runs in all, then fail; every look is judged at
    1 - (1 - confidence) / max_looks, Bonferroni over the planned looks, so repeated looks keep both
    error rates under 1 - confidence); point_estimate (decide by the point estimate as the gate did
    before intervals: for runs too small to prove anything, e.g. the tiny local model's 16 requests;
    every such check says so). vs_stable comparisons are also corrected together (Bonferroni over
    the release's comparisons): an unchanged candidate sits at the same distance from each limit."""

    confidence: Annotated[float, Field(ge=0.5, le=0.999, allow_inf_nan=False)] = 0.95
    inconclusive: Literal["fail", "extend", "point_estimate"] = "fail"
    max_looks: Annotated[int, Field(ge=1, le=10)] = 1
    # for the smallest detectable regression printed with each check, and for `pdops plan-load`
    power: Annotated[float, Field(ge=0.5, le=0.999, allow_inf_nan=False)] = 0.95

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
    # 300: the fewest with which the gate can prove anything by default. A p99 has an upper bound at
    # 95% only from 299 requests; an unchanged candidate is rolled back by vs_stable 1.1x (TTFT spread
    # 0.3) in 4.6% of releases at 300, 17% at 200 (scripts/bench_gate.py, docs/measurements.md).
    requests: Annotated[int, Field(gt=0, le=1_000_000)] | None = 300
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
