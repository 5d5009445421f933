"""The pipeline stages as plain typed functions: what `pdops` commands and Argo steps call."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from workflows.checks.run import blocking, check_rendered
from workflows.errors import InputError
from workflows.render import diff_fields
from workflows.render.manifest import Rendered, load_release
from workflows.render.serve_config import build_serve_config, validate_with_ray
from workflows.spec.release import ReleaseSpec, load_spec, spec_files
from workflows.targets.base import Baseline, Endpoint, Progress, ReleaseRecord, Skipped, Target, TargetError

if TYPE_CHECKING:
    from validation import interim
    from validation.config import LoadProfile
    from validation.reports import (
        BenchReport,
        CompatReport,
        Decision,
        DiffReport,
        GoldenReport,
        ReleaseOutcome,
        ReportFiles,
    )
    from validation.reports.release import ReleaseVerdict


def build_config(overlay: Path) -> dict[str, Any]:
    """The Ray Serve application config of an overlay, validated by Ray's own models."""
    spec = load_spec(overlay)
    config = build_serve_config(spec)
    validate_with_ray(config, str(Path(overlay) / "release.yaml"))
    return config


# ---- the release: rollout -> validate -> gate -> promote | rollback --------------------------------

def revision_of(path: Path) -> str:
    """The git commit the overlay was rendered from, `-dirty` when the worktree differs from it."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True).stdout.strip()

    sha = git("rev-parse", "HEAD")
    if not sha:
        return "worktree"
    return sha + ("-dirty" if git("status", "--porcelain", "--", ".", "../../kustomize") else "")


def new_run_dir(root: Path, environment: str) -> Path:
    """A fresh run folder, proven writable before anything is deployed."""
    run = Path(root) / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{environment}"
    try:
        run.mkdir(parents=True, exist_ok=False)
        probe = run / ".writable"
        probe.write_text("ok")
        probe.unlink()
    except FileExistsError:
        raise InputError(run, "", "run folder already exists (two releases in the same second?)",
                         "wait a second and run again") from None
    except OSError as exc:
        raise InputError(run, "", f"cannot write the run folder: {exc.strerror}",
                         "free disk space or pass a writable --runs DIR") from None
    return run


def record_of(rendered: Rendered, revision: str) -> ReleaseRecord:
    assert rendered.spec is not None
    return ReleaseRecord.of(rendered.text(), rendered.spec.name, rendered.spec.model.id, revision,
                            spec=rendered.spec.model_dump(mode="json"))


def recorded_spec(record: ReleaseRecord) -> ReleaseSpec:
    """The release.yaml `record` was released with (ReleaseRecord.spec): what the canary judges it by.
    Fails closed when the record holds none: judging a release by the branch head's SLOs and model
    would make a verdict about a spec that never served."""
    if not record.spec:
        raise TargetError(f"the serving release {record.short()} has no recorded spec (it was released by a "
                          "pdops that did not record release.yaml in the release history)",
                          ["release it again with this pdops (a new render: rollout, validate, promote) so its "
                           "spec is recorded, or run `pdops validate --slot stable --spec-from-overlay` with "
                           f"the overlay checked out at its revision {record.revision}"])
    try:
        return ReleaseSpec.model_validate(record.spec)
    except ValueError as exc:
        raise TargetError(f"the recorded spec of {record.short()} does not validate: {str(exc)[:300]}",
                          ["release it again with this pdops, or validate with --spec-from-overlay at "
                           f"revision {record.revision}"]) from None


def replaced_engines(before: Endpoint, after: Endpoint) -> list[str] | None:
    """Per phase, the engine replicas of `before` gone by `after` (None: the target names no replicas)."""
    if not before.metrics_phases:
        return None
    out = []
    for phase, selection in before.metrics_phases.items():
        was = set(selection.get("ReplicaId", []))
        now = set(after.metrics_phases.get(phase, {}).get("ReplicaId", []))
        if was - now:
            out.append(f"{phase} {', '.join(sorted(was - now))} replaced by "
                       f"{', '.join(sorted(now - was)) or 'nothing'}")
    return out


@dataclass
class Validation:
    """What validating a slot produced: the gate's decision and the reports it judged."""

    decision: Decision
    report: ReportFiles
    benches: list[BenchReport]
    golden: GoldenReport | None = None
    diff: DiffReport | None = None
    release: str | None = None      # the slot's release (ReleaseRecord.short), set by validate_slot
    stable_benches: list[BenchReport] | None = None   # stable measured live beside the candidate (interleaved)


def validate_candidate(endpoint: Endpoint, spec: ReleaseSpec, run: Path, progress: Progress,
                       reference: list[dict] | None, stable: list[dict] | None = None,
                       api_key: str | None = None, current: Callable[[], Endpoint] | None = None,
                       rendered: Rendered | None = None, reference_url: str | None = None,
                       release_file: Path | None = None,
                       reference_server: Callable[[], AbstractContextManager[str | Skipped | None]] | None = None,
                       baseline_server: Callable[[], AbstractContextManager[Baseline | Skipped]] | None = None,
                       ) -> Validation:
    """Compat, every load of the release's validation, golden tokens; then the gate. Writes the report.
    `stable`: the baseline benches `vs_stable` compares against (`stable_baseline`).
    `current` re-reads the candidate's endpoint after validation, to see engines that were replaced.
    `reference_url`: a single-engine reference serving during validation (pdops diff runs against it);
    `reference_server`: starts one for the golden tokens and the diff, after the loads (so it takes
    no CPU from them) and stops it after; golden answers come from it when `reference` is None.
    `baseline_server`: starts the baseline (`Target.baseline_server`: the stable release at its own size,
    loaded only by the benchmark); with `slo.vs_stable.measure: live` each load runs on the candidate
    and on it in paired blocks (workflows/pipeline/paired.py, validation/interleave.py) and `vs_stable` compares
    with that, never with `stable`; where no baseline runs, the gate is told why (fails closed)."""
    from validation import report

    candidate = Candidate(endpoint, spec, run, progress, api_key)
    compat = compat_suite(candidate)
    loads = CandidateLoads(candidate, rendered, baseline_server, stable)
    loads.first_look()
    why = certain_rollback(candidate, compat, loads)
    if why:   # no single-engine reference is started for a certain rollback
        wanted = (("golden_tokens", spec.validation.golden_prompts > 0),
                  ("diff", spec.validation.diff and release_file is not None))
        checks = ReferenceChecks(skipped={name: why for name, want in wanted if want})
        progress(f"[validate] golden tokens and diff skipped: {why}")
    else:
        checks = reference_checks(candidate, reference, reference_url, reference_server, release_file)
    decision = gate_over_looks(candidate, compat, loads, checks, current)
    if rendered is not None and rendered.overlay is not None:
        decision.advice = balance_advice(rendered, loads.benches, run, progress, loads.stable)
    try:
        files = report.write(run, decision, compat, loads.benches)
    except OSError as exc:
        raise RunFolderError(run, exc) from exc
    return Validation(decision=decision, report=files, golden=checks.golden, benches=loads.benches,
                      diff=checks.diff, stable_benches=loads.paired.benches() if loads.live else None)


@dataclass(frozen=True)
class Candidate:
    """What each part of a candidate's validation needs: where it serves, its release, the run folder
    the reports go to, the progress lines and the API key."""

    endpoint: Endpoint
    spec: ReleaseSpec
    run: Path
    progress: Progress
    api_key: str | None = None


def compat_suite(candidate: Candidate) -> CompatReport:
    """The OpenAI-compatibility suite against the candidate (validation/compat.py), as RUN/compat.json."""
    from validation import compat

    endpoint, spec = candidate.endpoint, candidate.spec
    candidate.progress(f"[validate] compatibility suite against {endpoint.base_url}")
    policy = spec.validation.compat
    result = compat.run(endpoint.base_url, spec.model.id, api_key=candidate.api_key, optional=policy.optional,
                        api_key_required=policy.api_key_required, progress=candidate.progress,
                        timeout=spec.validation.request_timeout_s)
    _dump(candidate.run / "compat.json", result)
    return result


class CandidateLoads:
    """The release's loads on the candidate, as RUN/bench-<i>-<profile>.json: alone, or with
    `slo.vs_stable.measure: live` paired block by block with the baseline (workflows/pipeline/paired.py),
    whose benches then replace the recorded `stable` ones `vs_stable` compares with."""

    def __init__(self, candidate: Candidate, rendered: Rendered | None,
                 baseline_server: Callable[[], AbstractContextManager[Baseline | Skipped]] | None,
                 stable: list[dict] | None) -> None:
        from workflows.pipeline.paired import PairedLoads

        self.candidate, self.rendered = candidate, rendered
        vs = candidate.spec.slo.vs_stable
        self.live = vs is not None and vs.measure == "live"
        no_server = lambda: nullcontext(Skipped("validation was given no way to start a baseline"))  # noqa: E731
        self.paired = PairedLoads(baseline_server or no_server, self.bench_of, candidate.endpoint,
                                  vs.blocks if vs is not None else 1, candidate.progress, _dump, candidate.run,
                                  client_required=candidate.spec.slo.client_health == "required")
        self.benches: list[BenchReport] = []
        # BenchReports once measured live; gate.decide coerces either
        self.stable: Sequence[BenchReport | dict[str, Any]] | None = stable
        self.no_baseline: str | None = None   # why vs_stable has no live baseline to compare with

    def bench_of(self, load: LoadProfile, warmup: int, seed: int, on: Endpoint | None = None,
                 requests: int | None = None, duration: float | None = None, *,
                 stop: interim.Stop | None = None) -> BenchReport:
        """One run of `load` against `on` (default: the candidate), priced when the release is rendered;
        `stop`: its interim looks (validation/interim.py)."""
        from validation import profiles, traces
        from validation.bench import BenchConfig, run_bench
        from validation.prometheus import PrometheusSource

        spec, on = self.candidate.spec, self.candidate.endpoint if on is None else on
        requests = requests if requests is not None else (load.requests if not load.duration_s else None)
        duration = duration if duration is not None else load.duration_s
        trace = traces.load(load.trace, load.trace_format, load.time_scale, load.requests) if load.trace else None
        source = PrometheusSource(spec.metrics.prometheus_url, on.prometheus_labels, on.prometheus_phase_label,
                                  on.metrics_lag_s) if spec.metrics.prometheus_url else None
        bench = run_bench(BenchConfig(
            on.base_url, spec.model.id, profiles.get(load.profile),
            concurrency=None if load.rate else load.concurrency, rate=load.rate, poisson=load.arrival == "poisson",
            requests=requests, duration=duration, warmup=warmup, ramp_s=load.ramp_s, trace=trace,
            api_key=self.candidate.api_key, seed=seed, tokenizer=on.tokenizer,
            timeout=spec.validation.request_timeout_s, isolate=True, progress=self.candidate.progress,
            metrics_url=on.metrics_url, metrics_select=on.metrics_labels or None,
            metrics_phases=on.metrics_phases or None, metrics_lag_s=on.metrics_lag_s, metrics_source=source,
            balance_policy=spec.validation.balance,
            goodput_ttft_ms=spec.slo.goodput_ttft_ms, goodput_tpot_ms=spec.slo.goodput_tpot_ms, stop=stop))
        if self.rendered is not None:   # $ per million tokens / 1,000 requests of this run (validation/cost.py)
            from workflows.pipeline.pricing import bench_cost
            bench.cost = bench_cost(bench, spec, self.rendered)
        return bench

    def measure(self, i: int, load: LoadProfile, warmup: int, seed: int) -> BenchReport:
        """One look at load #i, measured again while it comes back void (its client was starved, so its latencies
        say nothing of the candidate), at most slo.remeasure_void times; each void attempt is kept as
        RUN/bench-<i>-<profile>.void-<n>.json and named in the kept report's `void_attempts`. A void attempt
        is an error of the measuring tool, not a failure of the candidate: Argo Rollouts counts a metric's
        Error measurements apart from its Failed ones and errs the analysis only after consecutiveErrorLimit
        of them in a row (utils/defaults/defaults.go DefaultConsecutiveErrorLimit = 4). The gate still judges
        one valid run of each look, so its stated error rates (those of a valid run, docs/gate.md) hold; what a
        void attempt's interim looks decided is discarded with it. The last attempt, void too, is what the gate
        sees and fails closed on (slo.client_health: required)."""
        spec, progress = self.candidate.spec, self.candidate.progress
        retries = spec.slo.remeasure_void if spec.slo.client_health == "required" else 0
        voided: list[str] = []
        for attempt in range(retries + 1):
            mark = self.paired.mark(i)
            bench = self._measure_once(i, load, warmup, seed)
            why = bench.client_health.starved()
            if why is None or attempt == retries:
                bench.void_attempts = voided + bench.void_attempts
                return bench
            voided.append(why)
            self.paired.undo(i, mark)   # measure: live: the void run's baseline blocks go with it
            _dump(self.candidate.run / f"bench-{i}-{load.profile}.void-{attempt + 1}.json", bench)
            progress(f"[validate] load #{i} {load.profile}: measurement void, the client was starved ({why}); "
                     f"measuring it again ({attempt + 1} of slo.remeasure_void {retries})")
        raise AssertionError("unreachable: the last attempt returns")

    def _measure_once(self, i: int, load: LoadProfile, warmup: int, seed: int) -> BenchReport:
        """One run of load #i: paired with the baseline (measure: live), else on the candidate alone;
        either with the interim looks of slo.statistics.stop_early (validation/interim.py)."""
        from validation import interim

        spec = self.candidate.spec
        stops = interim.stops(spec.slo, len(spec.validation.load), load.requests if not load.duration_s else None)
        if self.live:
            return self.paired.measure(i, load, warmup, seed, stops)
        bench = self.bench_of(load, warmup, seed, stop=stops.alone if stops is not None else None)
        if bench.stopped_early is not None:
            self.candidate.progress(f"[validate] load #{i}: {bench.stopped_early.reason}")
        return bench

    @property
    def stopped(self) -> str | None:
        """Why the measurement stopped before its plan (a load's interim look), or None."""
        return next((b.stopped_early.reason for b in self.benches if b.stopped_early is not None), None)

    def first_look(self) -> None:
        """Every load once, with its warm-up. A load that stopped early (a failure beyond doubt: a certain
        rollback) ends the measurement: the later loads are not measured (the gate's `loads` check says so)."""
        with self.paired:   # the baseline is released before the reference engine starts (workflows/pipeline/paired.py)
            for i, load in enumerate(self.candidate.spec.validation.load):
                bench = self.measure(i, load, load.warmup_requests, 0)
                _dump(self.candidate.run / f"bench-{i}-{load.profile}.json", bench)
                self.benches.append(bench)
                if bench.stopped_early is not None:
                    break
        self._baseline_measured()

    def look_again(self, extend: list[int], look: int) -> None:
        """The loads the gate found inconclusive once more, each merged with its earlier looks."""
        from validation import interleave

        spec, progress = self.candidate.spec, self.candidate.progress
        with self.paired:
            for i in extend:
                load = spec.validation.load[i]
                progress(f"[validate] load #{i} {load.profile} inconclusive: look {look} of "
                         f"{spec.slo.statistics.max_looks}, the same load again")
                self.benches[i] = interleave.combine(self.benches[i], self.measure(i, load, 0, look - 1))
                _dump(self.candidate.run / f"bench-{i}-{load.profile}.json", self.benches[i])
        self._baseline_measured()

    def _baseline_measured(self) -> None:
        if self.live:   # the baseline measured here, never a recorded one from another day (docs/gate.md)
            self.stable = self.paired.benches()
            self.no_baseline = "; ".join(self.paired.missing) or None


@dataclass
class ReferenceChecks:
    """What the single-engine reference checked: golden tokens, the differential suite, and the checks
    skipped with the target's reason (gate.decide reports them as skipped)."""

    golden: GoldenReport | None = None
    diff: DiffReport | None = None
    skipped: dict[str, str] = field(default_factory=dict)


def reference_checks(candidate: Candidate, reference: list[dict] | None, reference_url: str | None,
                     reference_server: Callable[[], AbstractContextManager[str | Skipped | None]] | None,
                     release_file: Path | None) -> ReferenceChecks:
    """Golden tokens and pdops diff against one single-engine reference: `reference_url`, or one
    `reference_server` starts for both after the loads; golden answers come from it unless recorded
    ones (`reference`) are given."""
    spec, progress = candidate.spec, candidate.progress
    want_diff = spec.validation.diff and release_file is not None
    want_golden = reference is None and spec.validation.golden_prompts > 0
    server: AbstractContextManager[str | Skipped | None] = nullcontext(reference_url)
    if spec.validation.reference == "none" and reference_url is None and (want_diff or want_golden):
        server = nullcontext(Skipped("validation.reference is none"))
        progress("[validate] validation.reference: none: golden tokens and diff skipped")
    elif reference_url is None and reference_server is not None and (want_diff or want_golden):
        server = reference_server()   # one reference engine serves both checks
    out = ReferenceChecks()
    with server as ref:
        ref_url = ref if isinstance(ref, str) else None
        if isinstance(ref, Skipped):   # reported as skipped checks with the target's reason (gate.decide)
            out.skipped = {name: ref.reason for name, wanted in (("golden_tokens", want_golden), ("diff", want_diff))
                           if wanted}
        if want_golden and ref_url:
            reference = _reference_answers(candidate, ref_url)
        if reference is not None:
            out.golden = golden_tokens(candidate, reference)
        if want_diff and ref_url and release_file is not None:
            out.diff = differential_suite(candidate, ref_url, release_file)
    return out


def _reference_answers(candidate: Candidate, ref_url: str) -> list[dict]:
    from validation import golden

    spec = candidate.spec
    candidate.progress(f"[validate] golden tokens: the reference's answers from {ref_url}")
    return golden.collect(ref_url, spec.model.id, golden.prompts(spec.validation.golden_prompts),
                          spec.validation.golden_max_tokens, None, spec.validation.request_timeout_s)


def golden_tokens(candidate: Candidate, reference: list[dict]) -> GoldenReport:
    """The candidate's greedy answers to the reference's prompts, token by token, as RUN/golden.json."""
    from validation import golden

    spec = candidate.spec
    candidate.progress(f"[validate] golden tokens: {len(reference)} prompts against the single-engine reference")
    answers = golden.collect(candidate.endpoint.base_url, spec.model.id, golden.prompts(len(reference)),
                             spec.validation.golden_max_tokens, candidate.api_key, spec.validation.request_timeout_s)
    matched = golden.compare(reference, answers)
    _dump(candidate.run / "golden.json", matched)
    return matched


def differential_suite(candidate: Candidate, ref_url: str, release_file: Path) -> DiffReport:
    """The differential suite, `pdops diff` (validation/diff/release.py): P/D vs the single-engine
    reference, request by request."""
    from validation.diff.release import for_release

    spec, run = candidate.spec, candidate.run
    candidate.progress(f"[validate] differential suite: candidate vs single-engine reference {ref_url}")
    scenario_files, known_file = spec_files(spec.validation, release_file)
    try:
        return for_release(candidate.endpoint.base_url, ref_url, spec.model.id, scenario_files, known_file,
                           spec.validation.request_timeout_s, run, candidate.progress, candidate.api_key,
                           fields=diff_fields.cached())
    except OSError as exc:
        raise RunFolderError(run / "diff.json", exc) from exc


def certain_rollback(candidate: Candidate, compat: CompatReport, loads: CandidateLoads) -> str | None:
    """Why golden tokens and the diff can no longer change the verdict, or None. They only add checks, so a
    decision that already rolls back on what was measured stays a rollback, and no single-engine reference is
    started for it: on Kubernetes a RayService of the release's GPUs, on the local target an engine start and
    the differential suite (40 s and 75 s in the e2e tier's SLO-failing release, 2026-12-07). Not when the
    failures are inconclusive checks that slo.statistics.inconclusive: extend would measure again."""
    from validation import gate

    if loads.stopped:
        return "the measurement stopped early (a certain rollback)"
    spec = candidate.spec
    pending = {"golden_tokens": "not run yet", "diff": "not run yet"}
    decision = gate.decide(compat, loads.benches, spec.slo, loads.stable, None, None, None, look=1,
                           balance_block=spec.validation.balance.block, skipped=pending,
                           planned=spec.validation.load, no_baseline_reason=loads.no_baseline)
    if decision.verdict == "promote" or decision.extend:
        return None
    failed = [r for r in decision.reasons if r != decision.scope]
    return "the candidate already fails (a certain rollback): " + "; ".join(failed[:2]) + (
        f"; and {len(failed) - 2} more" if len(failed) > 2 else "")


def gate_over_looks(candidate: Candidate, compat: CompatReport, loads: CandidateLoads, checks: ReferenceChecks,
                    current: Callable[[], Endpoint] | None) -> Decision:
    """The gate's decision; while it finds a load inconclusive (slo.statistics.inconclusive: extend,
    validation/sequential.py), that load runs again and the gate decides on every look so far. The
    extra loads run after the reference engine has stopped, so they have the machine the first had."""
    from validation import gate

    spec = candidate.spec

    def decide(look: int) -> Decision:
        replaced = replaced_engines(candidate.endpoint, current()) if current else None
        return gate.decide(compat, loads.benches, spec.slo, loads.stable, checks.golden, replaced, checks.diff,
                           look=look, balance_block=spec.validation.balance.block, skipped=checks.skipped,
                           planned=spec.validation.load, no_baseline_reason=loads.no_baseline)

    look = 1
    decision = decide(look)
    while decision.extend:
        look += 1
        loads.look_again(decision.extend, look)
        decision = decide(look)
    return decision


def balance_advice(rendered: Rendered, benches: list[BenchReport], run: Path, progress: Progress,
                   stable: Sequence[BenchReport | dict[str, Any]] | None = None) -> list[str]:
    """`pdops advise` on the runs just made: the lines for the report, and RUN/advice.patch when a phase
    queued and the change passes `pdops check`; then how each run's queues moved since the same load
    in `stable` (the canary's trend). Never fails the release: advice is a report."""
    from validation.balance import Balance, trend_lines
    from workflows.pipeline.advise_patch import advise_runs

    runs = [(f"bench-{i}-{b.profile}.json", Balance.model_validate(b.balance))
            for i, b in enumerate(benches) if b.balance]
    if not runs:
        return []
    try:
        advice = advise_runs(Path(rendered.overlay or ""), runs, rendered=rendered)
        if advice.offered:
            _write(run / "advice.patch", advice.patch)
        lines = advice.lines() + ([f"patch: {run / 'advice.patch'}"] if advice.offered else [])
    except (InputError, OSError, ValueError) as exc:
        lines = [f"no advice: {exc}"]
    lines += trend_lines(benches, stable)
    for line in lines:
        progress(f"[balance] {line}")
    return lines


def stable_baseline(record: ReleaseRecord | None, progress: Progress) -> list[dict[str, Any]] | None:
    """The benches `vs_stable` compares a candidate with: those recorded when `record` was promoted
    (kept in the target's history, so the Argo pipeline has them without the earlier run's files),
    else its report folder's (local releases promoted before baselines were recorded)."""
    if record is None:
        return None
    if record.baseline is not None:
        return record.baseline
    if not record.report:
        return None
    try:
        benches = json.loads((Path(record.report) / "report.json").read_text()).get("benches")
    except (OSError, ValueError, AttributeError):
        progress(f"[validate] the stable release's report is unreadable ({record.report}); no vs-stable check")
        return None
    return benches if isinstance(benches, list) else None


_FETCH = object()   # validate_slot: ask the target for the golden reference


def validate_slot(target: Target, spec: ReleaseSpec | None, run: Path, progress: Progress, *,
                  slot: str = "candidate", digest: str | None = None, reference: Any = _FETCH,
                  api_key: str | None = None, rendered: Rendered | None = None) -> Validation:
    """Validate what a slot serves with the overlay's `validation` and `slo`: the stage `pdops release`
    runs after rollout, and what the Argo `validate` step (candidate) and pd-canary (stable) run.

    The candidate is compared with the last good release's baseline; the stable slot (the canary)
    with its own baseline from when it was promoted, so a release that drifted since is caught.
    `digest`: the release the caller means to judge; a slot holding another is refused (the
    cluster must serve what the overlay renders, or the verdict would be about something else).
    `spec` None: the slot's recorded spec (recorded_spec; the canary), never the branch head's."""
    status = target.status()
    held = status.candidate if slot == "candidate" else status.stable
    record = held.release
    if record is None:
        raise TargetError(f"no {slot} release to validate",
                          ["run `pdops rollout` first" if slot == "candidate" else "nothing has been promoted yet"])
    if spec is None:
        spec, rendered = _recorded(record, rendered, slot, progress)
    if record.model != spec.model.id:
        raise TargetError(f"the {slot} slot serves model {record.model}, the overlay's release.yaml names "
                          f"{spec.model.id}", ["validate with the overlay revision the slot was released from"])
    if digest is not None and record.digest != digest:
        raise TargetError(f"the {slot} slot holds {record.short()}, not the release the overlay renders "
                          f"({digest[7:19]})",
                          ["roll the overlay out first, or validate the revision that is deployed"])
    if reference is _FETCH:
        reference = golden_reference(target, record, spec, progress)
    baseline = stable_baseline(status.last_good if slot == "candidate" else record, progress)
    endpoint = target.endpoint(slot)  # type: ignore[arg-type]
    # vs_stable measured live: against a baseline of the stable release (Target.baseline_server), never
    # against the user-facing stable slot carrying users' traffic
    vs = spec.slo.vs_stable
    baseline_server = None
    if slot == "candidate" and vs is not None and vs.measure == "live":
        baseline_server = baseline_of_stable(target, status.stable.release or status.last_good, progress)
    progress(f"[validate] {slot} {record.short()} at {endpoint.base_url}")
    release_file = Path(rendered.overlay) / "release.yaml" if rendered is not None and rendered.overlay else None
    result = validate_candidate(endpoint, spec, run, progress, reference, baseline, api_key,
                                lambda: target.endpoint(slot), rendered,  # type: ignore[arg-type]
                                release_file=release_file,
                                reference_server=lambda: target.reference_server(record, progress),
                                baseline_server=baseline_server)
    result.release = record.short()
    return result


def golden_reference(target: Target, record: ReleaseRecord, spec: ReleaseSpec,
                     progress: Progress) -> list[dict] | None:
    """The target's reference answers to the golden prompts, or None where they come from elsewhere or
    nowhere: golden tokens off, the diff on (its reference engine answers them), validation.reference none."""
    if not (spec.validation.golden_prompts and not spec.validation.diff and spec.validation.reference != "none"):
        return None
    from validation import golden

    return target.reference(record, golden.prompts(spec.validation.golden_prompts),
                            spec.validation.golden_max_tokens, progress)


def _recorded(record: ReleaseRecord, rendered: Rendered | None, slot: str,
              progress: Progress) -> tuple[ReleaseSpec, Rendered | None]:
    """The slot's recorded spec, and `rendered` only when it renders that very release: pricing, the
    balance advice and the diff's release file of another render would describe the branch head."""
    spec = recorded_spec(record)
    progress(f"[validate] {slot} judged by the spec recorded with {record.short()} (revision {record.revision})")
    checkout = record_of(rendered, "").digest if rendered is not None else record.digest
    if checkout != record.digest:
        progress(f"[validate] the overlay renders {checkout[7:19]}, not the serving "
                 f"{record.digest[7:19]}: cost, balance advice and diff are skipped (they would describe it)")
        rendered = None
    return spec, rendered


def baseline_of_stable(target: Target, stable: ReleaseRecord | None,
                       progress: Progress) -> Callable[[], AbstractContextManager[Baseline | Skipped]]:
    """What starts vs_stable's baseline for a candidate: the target's baseline of `stable`, or why none can run."""
    if stable is None:
        return lambda: nullcontext(Skipped("no stable release yet (a first release): nothing to compare with"))
    server = getattr(target, "baseline_server", None)
    if server is None:
        return lambda: nullcontext(Skipped(f"the {target.kind} target cannot run a baseline"))
    return lambda: server(stable, progress)


def baseline_of(report: str | None) -> list[dict] | None:
    """The benches of a report folder, as a promote records them for later `vs_stable` checks."""
    if not report:
        return None
    try:
        benches = json.loads((Path(report) / "report.json").read_text()).get("benches")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(benches, list):
        return None
    from validation.verdicts import baseline  # what vs_stable's rank tests read, small enough for history
    return [baseline(b) if isinstance(b, dict) else b for b in benches]


class RunFolderError(Exception):
    """The run folder stopped taking writes mid-release (disk full, removed, read-only mount)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc}")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise RunFolderError(path, exc) from exc


def _dump(path: Path, data: Any) -> None:
    """A report model as its JSON (validation/reports/), anything else as JSON."""
    from pydantic import BaseModel

    _write(path, data.model_dump_json(indent=2, by_alias=True, fallback=str) if isinstance(data, BaseModel)
           else json.dumps(data, indent=2, default=str))


class Settled(NamedTuple):
    unchanged: bool          # the release already serves as stable: nothing to roll out
    action: str | None       # what settling did (a rollback's one line), None when nothing


def settle_candidate(target: Target, record: ReleaseRecord, progress: Progress, *,
                     dry_run: bool = False) -> Settled:
    """Before `record` rolls out, what an earlier run left is settled by one rule, the same for
    `pdops release` and the Argo rollout step (issue 22 item 5). Called holding the target's lock
    (session()), so no live run owns what it finds:
    - another release's candidate pending: rolled back, recorded as superseded by `record` (a dry run
      only says so, and the rollout then refuses as the target does);
    - `record` itself pending: left for the rollout to resume (the target's apply returns it);
    - `record` already stable and serving: unchanged, nothing to do; stable but not serving: restored
      (rollback), then unchanged."""
    status = target.status()
    pending = status.candidate.release
    if pending is not None and pending.digest != record.digest:
        if dry_run:
            progress(f"[rollout] dry run: a real run would first roll back the half-done candidate {pending.short()}")
        else:
            progress(f"[rollout] found a half-done candidate {pending.short()} from an earlier run: undoing it")
            target.rollback([f"left half way by an earlier run; superseded by {record.short()}"], None, progress)
            status = target.status()
    stable = status.stable.release
    if stable is None or stable.digest != record.digest:
        return Settled(False, None)
    if status.stable.state == "ready":
        progress(f"[release] {record.short()} is already stable and serving: nothing to do")
        return Settled(True, None)
    progress(f"[release] {record.short()} is the stable release but is {status.stable.state}: restoring it")
    return Settled(True, target.rollback([f"stable was {status.stable.state}"], None, progress))


def release(overlay: Path, target: Target, run: Path, progress: Progress, *, revision: str | None = None,
            ready_timeout_s: float | None = None, schema_dir: Path | None = None,
            api_key: str | None = None) -> ReleaseOutcome:
    """One release end to end. Returns the outcome (also written to RUN/release.json).

    Nothing is applied before build-config and every check pass. Once the candidate is applied,
    every way out (verdict rollback, target failure, crash of a step, Ctrl-C) ends in rollback, so
    the stable slot is never left beside a half-done candidate."""
    from validation.reports.release import ReleaseOutcome

    outcome = ReleaseOutcome(overlay=str(overlay), run=str(run), target=target.kind)
    finish = _finisher(outcome, run, progress)
    rendered, blocked = render_and_check(overlay, run, progress, schema_dir)
    if blocked:
        return finish("blocked", blocked)
    spec = rendered.spec
    assert spec is not None
    record = record_of(rendered, revision or revision_of(overlay))
    outcome.release, outcome.digest, outcome.revision = record.short(), record.digest, record.revision

    with target.session():
        settled = settle_candidate(target, record, progress)
        if settled.unchanged:
            return finish("unchanged", ["the rendered manifest equals the stable release's"
                                        + ("; restored it" if settled.action else "")], action=settled.action)
        # with the diff on, golden answers come from its reference engine; else fetched before the rollout
        reference = golden_reference(target, record, spec, progress)
        progress(f"[3/5 rollout] {record.short()} as the candidate on the {target.kind} target")
        try:
            record = target.apply(record, progress)
            target.wait_ready(ready_timeout_s or spec.timeouts.rollout_s, progress)
            progress("[4/5 validate] the candidate serves")
            result = validate_slot(target, spec, run, progress, digest=record.digest, reference=reference,
                                   api_key=api_key, rendered=rendered)
        except (TargetError, RunFolderError) as exc:
            reasons = ([f"candidate failed on the target: {exc.problem}", *exc.details]
                       if isinstance(exc, TargetError) else [f"validation could not record its results: {exc}"])
            progress("[5/5 rollback] " + reasons[0])
            undo = target.rollback(reasons, str(run), progress)
            return finish("failed", reasons, action=undo)
        except BaseException as exc:  # a crash or Ctrl-C after apply must not leave the candidate
            progress(f"[5/5 rollback] release interrupted ({type(exc).__name__}): undoing the candidate")
            target.rollback([f"release interrupted: {type(exc).__name__}: {exc}"], str(run), progress)
            raise
        decision = result.decision
        outcome.report, outcome.checks_failed, outcome.checks_passed = result.report, decision.failed, decision.passed
        if decision.verdict == "promote":
            progress("[5/5 promote] every gate passed")
            target.promote(decision.reasons, str(run), progress, baseline=baseline_of(str(run)))
            return finish("promote", decision.reasons)
        progress(f"[5/5 rollback] {decision.failed} gate check(s) failed")
        undo = target.rollback(decision.reasons, str(run), progress)
        return finish("rollback", decision.reasons, action=undo)


def _finisher(outcome: ReleaseOutcome, run: Path,
              progress: Progress) -> Callable[..., ReleaseOutcome]:
    """finish(verdict, reasons, action=None): the outcome completed, timed from now and written to
    RUN/release.json (a run folder that stopped taking writes leaves it printed only)."""
    started = time.monotonic()

    def finish(verdict: ReleaseVerdict, reasons: list[str], action: str | None = None) -> ReleaseOutcome:
        outcome.verdict, outcome.reasons, outcome.action = verdict, reasons, action
        outcome.seconds = round(time.monotonic() - started, 1)
        try:
            _dump(run / "release.json", outcome)
        except RunFolderError as exc:  # the verdict stands: it is printed and in the target's history
            progress(f"[release] {exc}; the outcome is printed only")
        return outcome

    return finish


def render_and_check(overlay: Path, run: Path, progress: Progress,
                     schema_dir: Path | None) -> tuple[Rendered, list[str]]:
    """Steps 1 and 2: the overlay rendered (RUN/serve-config.yaml, RUN/manifest.yaml) and checked
    (RUN/check.json); the blocking findings, empty when the release may roll out."""
    from workflows.checks.schema import schema_dir_from_env
    from workflows.render.manifest import dump_yaml

    progress("[1/5 build-config] release spec -> Ray Serve LLM config (validated by Ray's own models) -> "
             "kustomize render")
    rendered = load_release(str(overlay), None)
    _write(run / "serve-config.yaml", dump_yaml(rendered.serve_config))
    progress("[2/5 check] cross-layer rules and pinned schemas, before anything is applied")
    findings = check_rendered(rendered, schema_dir or schema_dir_from_env())
    _dump(run / "check.json", [f.to_dict() for f in findings])
    for warning in (f for f in findings if f.severity == "warning"):
        progress(f"[check] {warning.render()}")
    if blocking(findings):
        return rendered, [f.render() for f in blocking(findings)]
    _write(run / "manifest.yaml", rendered.text())
    return rendered, []
