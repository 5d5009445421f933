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
    """Candidate metric must be at most this factor times the stable release's last report."""

    ttft_p90: Factor | None = None
    tpot_p90: Factor | None = None
    itl_p90: Factor | None = None
    # $ per 1,000 requests (validation/cost.py) at most this factor times the stable release's.
    cost: Factor | None = None


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


class LoadProfile(_Strict):
    """One benchmark run of the release's validation: a named traffic profile at a load, or a trace
    of the team's own traffic replayed (validation/traces.py) with its own arrivals and lengths."""

    profile: Name = "balanced"
    concurrency: Annotated[int, Field(gt=0, le=4096)] | None = 4
    rate: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    requests: Annotated[int, Field(gt=0, le=1_000_000)] | None = 32
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
