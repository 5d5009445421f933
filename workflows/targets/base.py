"""Where a release runs. Two targets implement this: `local` (Ray on 127.0.0.1) and `kubernetes` (EKS).

Both keep two slots. `stable` serves users; `candidate` holds a new release that is validated
before it takes the stable name. Physically a slot is a colour (`blue` / `green`): promotion only
moves the stable pointer (a Service selector, a local route), so the promoted engines keep running.

Release logic (what to validate, when to promote) lives in workflows/pipeline/steps.py, never in a target.
Every target keeps its own history of records (local: files; kubernetes: a ConfigMap) so the last
good release can be redeployed from the target alone.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, Field

SLOTS = ("stable", "candidate")
COLOURS = ("blue", "green")
Verdict = Literal["pending", "promote", "rollback", "failed", "regressed"]
Progress = Callable[[str], None]


def other_colour(colour: str) -> str:
    return COLOURS[1 - COLOURS.index(colour)]


def manifest_digest(manifest: str) -> str:
    return "sha256:" + hashlib.sha256(manifest.encode("utf-8")).hexdigest()


class Endpoint(BaseModel):
    base_url: str                    # OpenAI API root, ending in /v1
    # Prometheus text with vllm:* / ray_vllm_* (KV-transfer evidence): one URL, or several separated by
    # commas, each tagged with the phase of its engines, `http://10.0.3.7:8080/metrics#decode`, where
    # every node exports only its own processes (validation.server_metrics.sources)
    metrics_url: str | None = None
    # Label filter selecting this slot's engines in a metrics endpoint shared by both slots.
    metrics_labels: dict[str, list[str]] = {}   # label -> accepted values (any of them)
    # Per phase ("prefill", "decode"): the label selection of that phase's engines, where known.
    metrics_phases: dict[str, dict[str, list[str]]] = {}
    metrics_lag_s: float = 0.0       # how stale metrics_url can be (Ray exports every 10 s)
    # The labels selecting this slot's engines in the environment's Prometheus (spec `metrics.prometheus_url`,
    # validation/prometheus.py) as the PodMonitor's relabelling sets them, and the label naming each one's phase.
    prometheus_labels: dict[str, str] = {}
    prometheus_phase_label: str | None = None
    # The served model's tokenizer as a local HF directory, where the target has it: the benchmark
    # then sends prompts of the profile's exact token count (without it, ~2x with the tiny model).
    tokenizer: str | None = None


class ReleaseRecord(BaseModel):
    """One rendered release as a target holds it: enough to redeploy it from this record alone."""

    name: str                        # release name (spec.name)
    revision: str                    # git revision it was rendered from ("worktree" when not committed)
    digest: str                      # manifest_digest(manifest): identity for idempotent re-runs
    manifest: str                    # the rendered, checked multi-document YAML
    model: str                       # the model id clients send
    colour: str = ""                 # which physical slot holds it (set by the target on apply)
    applied_at: float = Field(default_factory=time.time)
    verdict: Verdict = "pending"
    reasons: list[str] = []
    report: str | None = None        # where this release's validation report is (path or artifact)
    # The benches it was promoted on (slim: summaries, no samples): what `vs_stable` compares later
    # candidates, and the canary the release itself, with, wherever the report files are.
    baseline: list[dict] | None = None
    decided_at: float | None = None
    # The release.yaml it was rendered from, as validated (ReleaseSpec JSON, ~2-3 KiB): what the canary
    # judges the serving release by, whatever the branch head says now; it moves with the record (a
    # restore carries it). Not part of the digest. None: recorded by a pdops before it kept specs.
    spec: dict[str, Any] | None = None
    # Golden answers of the single-engine reference for this release, by key (kube golden_cache.key:
    # engine, prompts, max_tokens): cached in the record, so they rotate and are deleted with it and a
    # restore of an older release brings its own; the reference engine starts only on a miss.
    golden: dict[str, list[dict]] | None = None

    @classmethod
    def of(cls, manifest: str, name: str, model: str, revision: str,
           spec: dict[str, Any] | None = None) -> ReleaseRecord:
        return cls(name=name, revision=revision, digest=manifest_digest(manifest), manifest=manifest, model=model,
                   spec=spec)

    def short(self) -> str:
        return f"{self.name}@{self.revision[:12]} ({self.digest[7:19]})"

    def named(self, ident: str) -> bool:
        """`ident` names this release: its digest, the digest's 12 characters `short()` shows, or `short()`."""
        return ident in (self.digest, self.digest[7:19], self.short())


class SlotStatus(BaseModel):
    slot: Literal["stable", "candidate"]
    release: ReleaseRecord | None = None
    state: Literal["absent", "deploying", "ready", "failed", "unknown"] = "absent"
    detail: str = ""
    endpoint: Endpoint | None = None


class TargetStatus(BaseModel):
    target: str
    stable: SlotStatus
    candidate: SlotStatus
    last_good: ReleaseRecord | None = None
    leftovers: list[str] = []   # objects a run that died left behind (e.g. a reference RayService)


@dataclass
class Baseline:
    """The stable release serving only the benchmark, beside the candidate, at the stable render's size
    (`Target.baseline_server`): the other side of vs_stable's paired blocks (validation/interleave.py).
    Never the user-facing slot: user traffic there would slow stable and lean the comparison toward
    the candidate."""

    endpoint: Endpoint
    release: str                     # what it serves (ReleaseRecord.short())
    how: str                         # one line for the log: where it runs and why the comparison is fair
    # why a block measured on it must not count (requests that were not the benchmark's), else None;
    # takes the block's BenchReport (validation.interleave.foreign_requests)
    void_reason: Callable[[Any], str | None] = field(default=lambda bench: None)


class Skipped(NamedTuple):
    """Why a target has no reference engine this time (no room, never ready, dry run): golden tokens
    and the diff are then reported as skipped with this reason, never passed silently."""
    reason: str


EXIT_TRANSIENT = 75   # sysexits.h EX_TEMPFAIL: "try again later"; the only exit code Argo retries


class TargetError(Exception):
    """The target could not do what was asked (not ready in time, deploy failed, busy). Exit 1.

    `transient`: the target could not be reached or answered 5xx/429 (not a verdict about the
    release): the CLI exits EXIT_TRANSIENT and the Argo steps retry on that code alone."""

    def __init__(self, problem: str, details: list[str] | None = None, *, transient: bool = False) -> None:
        self.problem, self.details, self.transient = problem, list(details or []), transient
        super().__init__(self.render())

    def render(self) -> str:
        return self.problem + "".join(f"\n  {d}" for d in self.details)


class Target(Protocol):
    kind: str

    def session(self) -> AbstractContextManager[None]:
        """Held for a whole release; a second release on the same target fails at once (TargetError)."""

    def status(self) -> TargetStatus:
        """Both slots and the last good release, read from the target (never from memory)."""

    def apply(self, record: ReleaseRecord, progress: Progress) -> ReleaseRecord:
        """Deploy `record` into the candidate slot and return it with its colour set.

        Idempotent: the same digest already pending is left as it is. Refuses (TargetError) when a
        different candidate is pending, so a half-done release is undone before another starts."""

    def wait_ready(self, timeout_s: float, progress: Progress) -> Endpoint:
        """Block until the candidate serves, or raise TargetError with what the target reported."""

    def endpoint(self, slot: Literal["stable", "candidate"]) -> Endpoint:
        """How validation and users reach a slot."""

    def promote(self, reasons: list[str], report: str | None, progress: Progress, *,
                baseline: list[dict] | None = None) -> ReleaseRecord:
        """Candidate takes the stable name; it is recorded as the last good release (with `baseline`,
        the benches it was promoted on)."""

    def rollback(self, reasons: list[str], report: str | None, progress: Progress, *,
                 to_previous: bool = False, regressed: str | None = None) -> str:
        """Undo: drop a pending candidate (recorded with its verdict) and make sure stable serves the
        last good release, redeploying it from history when it is missing. With `to_previous`, the
        current stable is marked regressed and the good release before it is restored; `regressed`
        names the release the caller found regressed (ReleaseRecord.named), so a retry after it was
        already replaced does not regress the restored release too. Returns what it did, in one line."""

    def history(self) -> list[ReleaseRecord]:
        """Decided releases, oldest first."""

    def reference_server(self, record: ReleaseRecord,
                         progress: Progress) -> AbstractContextManager[str | Skipped | None]:
        """A single non-disaggregated engine of the record's model serving while the block runs: its
        OpenAI base URL, Skipped(why) when it cannot run this time, or None where this target cannot
        run one. Golden tokens and `pdops diff` share it."""

    def baseline_server(self, record: ReleaseRecord, progress: Progress) -> AbstractContextManager[Baseline | Skipped]:
        """`record` (the stable release) deployed at its own size, loaded by nothing but the benchmark
        while the block runs, and removed when it ends, on every exit path: the baseline vs_stable
        compares the candidate with. Skipped(why) when none can run this time (the gate then fails
        vs_stable closed, or skips it under `slo.vs_stable.without_baseline: absolute_only`)."""

    def reference(self, record: ReleaseRecord, prompts: list[str], max_tokens: int,
                  progress: Progress) -> list[dict] | None:
        """Answers of one non-disaggregated engine of the record's model to `prompts` (greedy, token
        ids; validation.golden.complete), or None when this target cannot run such an engine."""


HISTORY_KEEP = 20


def last_good(history: list[ReleaseRecord]) -> ReleaseRecord | None:
    """The newest promoted release that has not since been found regressed."""
    return next((r for r in reversed(history) if r.verdict == "promote"), None)


def appended(history: list[ReleaseRecord], record: ReleaseRecord, keep: int = HISTORY_KEEP) -> list[ReleaseRecord]:
    """History with `record` added, trimmed to `keep` entries; the last good release is never trimmed."""
    out = history + [record]
    good = last_good(out)
    while len(out) > keep:
        drop = next(i for i, r in enumerate(out) if r is not good)
        out.pop(drop)
    return out
