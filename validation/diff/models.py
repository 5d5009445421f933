"""Typed shapes of `pdops diff`: a case (one request body), one side's answer, a case's result.

An `Answer` is what one endpoint said to one request, normalised so that a non-streamed and a
streamed answer, or a candidate's and a reference's, compare field by field: status, OpenAI error
shape, per choice text, token ids, finish/stop reason and logprobs, usage, and which response
fields were present (a field the candidate drops is a divergence even when the rest agrees).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Api = Literal["chat", "completions"]
Outcome = Literal["same", "differs", "known", "error"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Expect(_Strict):
    """What a team's scenario requires of the candidate, on top of agreeing with the reference."""

    status: int | None = Field(None, ge=100, le=599)
    # JSON schema of the whole (non-streamed) response body.
    body_schema: dict[str, Any] | None = None
    # JSON schema every choice's output (message content / text, parsed as JSON) must satisfy.
    output_schema: dict[str, Any] | None = None


class Case(_Strict):
    name: str = Field(min_length=1, max_length=120)
    api: Api
    body: dict[str, Any]            # exactly what is sent (the model is filled in by the runner)
    # Also send the body streamed (stream_options.include_usage) and require each side's streamed
    # answer to equal its own non-streamed one. Off for bodies that stream already or fail (4xx).
    also_stream: bool = True
    covers: list[str] = []          # request fields this case exercises (the coverage test reads it)
    expect: Expect | None = None    # scenarios only
    source: str = "matrix"          # "matrix" or FILE:LINE of a scenario


class Choice(BaseModel):
    index: int
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # (token, logprob) per generated token, and the top alternatives' token strings, when requested
    logprobs: list[tuple[str, float | None]] | None = None
    top_logprobs: list[list[str]] | None = None
    tool_calls: list[Any] | None = None
    # completions: vLLM puts the prompt's token ids and logprobs on each choice
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: Any = None
    keys: list[str] = []            # fields present in this choice (message fields as message.X)


class Answer(BaseModel):
    """One endpoint's answer to one request body."""

    stream: bool = False
    status: int | None = None       # None: no HTTP answer at all (refused, timeout, reset)
    transport_error: str | None = None
    error_shape_ok: bool | None = None   # an error answer is {"error": {"message": str, "type": str, ...}}
    error_message: str | None = None
    choices: list[Choice] = []
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[Any] | None = None
    prompt_logprobs: Any = None
    keys: list[str] = []            # top-level response fields present
    chunks: int | None = None       # streamed: number of data events before [DONE]
    done: bool | None = None        # streamed: ended with data: [DONE]
    seconds: float = 0.0
    excerpt: str = ""               # the start of the raw body, for the report
    body: Any = None                # the non-streamed JSON body (scenarios' `expect` reads it)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Side(BaseModel):
    """One endpoint's answers to one case: non-streamed, and streamed when the case asks."""

    answer: Answer
    streamed: Answer | None = None


class CaseResult(BaseModel):
    name: str
    api: Api
    request: dict[str, Any]
    stream_request: dict[str, Any] | None = None
    outcome: Outcome
    candidate: Side | None = None
    reference: Side | None = None
    detail: str = ""
    differences: list[str] = []
    known: KnownDivergence | None = None
    source: str = "matrix"


class KnownDivergence(_Strict):
    """One entry of a known-divergences file: data, so a team can accept it without code."""

    case: str = Field(min_length=1, max_length=120)      # the case name
    # Optional: only a divergence whose detail contains this text is the known one (a different
    # divergence of the same case is still new).
    match: str | None = Field(None, min_length=1, max_length=500)
    reason: str = Field(min_length=1, max_length=2000)
    link: str = Field(min_length=1, max_length=500)
    versions: str | None = Field(None, max_length=200)   # e.g. "Ray 2.60.0, vLLM 0.32.0"


class Summary(BaseModel):
    cases: int
    same: int
    differs: int
    known: int
    error: int
    # known entries whose case ran and agreed: the divergence is gone, remove the entry
    known_not_reproduced: list[str] = []
    # known entries naming no case that ran (misspelt, or a scenario that was removed)
    known_unused: list[str] = []
    seconds: float
    base_url: str
    reference_url: str
    model: str
    ok: bool                        # no unexpected divergence and no error


class Report(BaseModel):
    kind: Literal["diff"] = "diff"
    cases: list[CaseResult]
    summary: Summary
    uncovered: dict[str, dict[str, str]] = {}   # api -> field -> why it has no case


CaseResult.model_rebuild()
