"""What a release says about its own validation: SLO gates and load, kept in git in release.yaml.

The release spec (workflows/spec.py) embeds these models; `pdops gate`, `pdops bench` and
`pdops compat` read them, so a threshold has exactly one home.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrefillSLO(_Strict):
    """Time to first token: queue + prefill + KV transfer + first decode step."""

    ttft_p90_ms: PositiveFloat | None = None
    ttft_p99_ms: PositiveFloat | None = None


class DecodeSLO(_Strict):
    """Per-token latency after the first token: ITL pooled over chunks, TPOT per request."""

    itl_p90_ms: PositiveFloat | None = None
    itl_p99_ms: PositiveFloat | None = None
    tpot_p90_ms: PositiveFloat | None = None
    tpot_p99_ms: PositiveFloat | None = None


class VsStable(_Strict):
    """Candidate metric must be at most this factor times the stable release's last report."""

    ttft_p90: PositiveFloat | None = None
    tpot_p90: PositiveFloat | None = None
    itl_p90: PositiveFloat | None = None


class SLO(_Strict):
    prefill: PrefillSLO = PrefillSLO()
    decode: DecodeSLO = DecodeSLO()
    max_error_rate: float = Field(0.0, ge=0.0, le=1.0)
    # Goodput (DistServe): requests/s that meet both goodput_ttft_ms and goodput_tpot_ms.
    goodput_ttft_ms: PositiveFloat | None = None
    goodput_tpot_ms: PositiveFloat | None = None
    min_goodput_rps: float | None = Field(None, ge=0.0)
    min_slo_attainment: float | None = Field(None, ge=0.0, le=1.0)
    kv_transfer: Literal["required", "ignored"] = "required"
    # required: a run whose load generator was starved (event-loop lag, CPU) is void. ignored: for a
    # machine where the harness must share its cores with the engines (overlays/local), whose
    # figures are reports anyway; the starvation is still shown in every report.
    client_health: Literal["required", "ignored"] = "required"
    vs_stable: VsStable | None = None


class LoadProfile(_Strict):
    """One benchmark run of the release's validation: a named traffic profile at a load."""

    profile: str = "balanced"
    concurrency: PositiveInt | None = 4
    rate: PositiveFloat | None = None
    requests: PositiveInt | None = 32
    duration_s: PositiveFloat | None = None
    warmup_requests: int = Field(2, ge=0)


class CompatPolicy(_Strict):
    """Which compatibility cases must pass; others are reported but do not block promotion."""

    optional: list[str] = []
    api_key_required: bool = False


class Validation(_Strict):
    load: list[LoadProfile] = [LoadProfile()]
    compat: CompatPolicy = CompatPolicy()
    golden_prompts: PositiveInt = 4
    golden_max_tokens: PositiveInt = 16
