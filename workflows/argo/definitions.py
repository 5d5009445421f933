r"""The Argo side of the pipeline: `pd-release` (WorkflowTemplate) and `pd-canary` (CronWorkflow), built with Hera.

Nothing here talks to a cluster, and nothing here decides *what* is validated: every step is a thin
call of the `pdops` CLI in the step image (see /Dockerfile), the same stage functions `pdops release`
runs, reading the overlay's release.yaml. `render_all()` returns the YAML committed under
`kustomize/argo/`; `pdops workflows render --out kustomize/argo` rewrites it (a test fails on drift),
and the Argo execution tier (tests/argo) runs that committed YAML step by step.

    check -> rollout -> validate -> promote    (verdict promote)
                                \-> rollback   (any other verdict, or validate failed)
    rollout verdict unchanged:   check -> rollout (the release already serves as stable: a no-op)
    dry-run=true:          check -> rollout --dry-run (the API server admits every object; nothing stored)
    skip-to-rollback=true: only skip-to-rollback (drop a candidate, restore the last good release)
    onExit:                rollback-if-pending when the workflow did not succeed (the safety net), then unlock
    lock (first) / unlock (exit handler): the run's environment Lease (workflows/cli/run.py); every writing
    step runs with $PDOPS_RUN_ID and fails, naming the holder, when its run does not hold it

Each step writes `verdict` and `summary` output files (workflows/pipeline/step_outputs.py) exported as the
workflow's global outputs, so a run that ends at any step says why, and its metrics are emitted.
Retries: only exit code 75 (the target was unreachable or answered 5xx: workflows/targets/base.py
EXIT_TRANSIENT), never a verdict; every step the CLI runs is idempotent, so a retry is safe.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

from workflows.names import (  # noqa: F401 (re-exported)
    API_KEY_ENV,
    API_KEY_SECRET,
    ENV_NAMESPACES,
    ENVIRONMENTS,
    PART_OF,
    RUN_ENV,
    RUN_LEASE_S,
    SERVICE_ACCOUNT,
    WORKFLOW_NAMESPACE,
)
from workflows.pipeline.step_outputs import FIGURES
from workflows.spec.release import SPEC_FILE, STEP_MARGIN_S, Timeouts, parse_spec, read_yaml_file
from workflows.targets.base import EXIT_TRANSIENT

STEP_IMAGE = "ghcr.io/pdops/pdops-step:0.1.0"
REPO_URL = "https://github.com/pdops/pdops.git"
SRC = "/workspace/src"          # git input artifact (the revision under release)
OUT = "/tmp/out"                # each step's output-parameter files (step_outputs.write)
RUN = "/tmp/run"                # validate's run folder (compat, bench, report), an artifact
HOME = "/tmp"                   # the steps' HOME: the emptyDir, the only writable place
# check's render cache (workflows/render/cache.py cache_dir() under HOME=/tmp): Ray's verdict on the serve config,
# the kustomize build and the converted CRD schemas, keyed by their inputs and the installed versions. rollout
# takes it as an input artifact: the same image, revision and overlay hit every entry, so rollout's render
# skips importing Ray Serve LLM's models (11-14 s of CPU per pod, 2026-12-07); any other input misses and is
# computed again. Optional both ways: a check that died early hands on nothing and rollout renders in full.
RENDER_CACHE = f"{HOME}/.cache/pdops"
RUN_AS_USER = 10001              # matches the Dockerfile's user
# Every step but validate: `pdops render overlays/prod` peaks at ~720 MiB (717 measured) with the cold cache a step pod
# has without check's render cache (scripts/step_memory.py; docs/measurements.md), so 1 GiB leaves ~30 % headroom
# (512 Mi: OOM-killed); rollout keeps that room for a run whose check handed on no cache. The Argo tier enforces it
# (tests/argo/pod.py's RSS watcher, as uid 10001 in the step image's install) and measured on 2026-12-07 (overlays/dev,
# 59 tests): check 726 MiB, rollout 90 MiB with check's cache (719 before), promote/rollback/lock/unlock under 90 MiB.
STEP_MEMORY = "1Gi"
# validate and validate-stable: the Argo tier's watcher measured 1207 MiB (overlays/dev, 2026-12-06), 736 MiB since
# validate renders without Ray's models (2026-12-07): 2 GiB leaves room for a longer load's reports.
VALIDATE_MEMORY = "2Gi"
P = "{{workflow.parameters.%s}}"
OVERLAY = "overlays/" + P % "environment"
ENV_NS = "llm-" + P % "environment"   # overlays/<env> use namespace llm-<env> (names.ENV_NAMESPACES)
RUN_ID = "{{workflow.name}}"          # the run's Lease holder is `run <workflow name>` (workflows/cli/run.py)

GAUGES = {  # metric name -> [(output figure, phase, quantile)]
    "pd_release_ttft_ms": [("ttft-p50-ms", "prefill", "p50"), ("ttft-p99-ms", "prefill", "p99")],
    "pd_release_itl_ms": [("itl-p50-ms", "decode", "p50"), ("itl-p99-ms", "decode", "p99")],
    "pd_release_kv_prompt_tokens": [("kv-prompt-tokens", "kv-transfer", "total")],
}
GAUGE_HELP = {"pd_release_ttft_ms": "time to first token (ms) of the first validation load, by phase and quantile",
              "pd_release_itl_ms": "inter-token latency (ms) of the first validation load, by phase and quantile",
              "pd_release_kv_prompt_tokens": "prompt tokens that arrived by NIXL KV transfer in the first load"}

# Every deadline derives from release.yaml `timeouts` (workflows/spec/release.py), the widest over the committed
# overlays: a step's activeDeadlineSeconds is its waits (Timeouts.step_waits) plus STEP_MARGIN_S, so the
# CLI times out first and prints its diagnosis (failing pods, Events) before Argo kills the pod; the
# workflow's deadline is the longest chain of step deadlines (Argo cuts each pod's deadline to what is
# left of the workflow's: workflowpod.go createWorkflowPod). `pdops check` (checks/deadlines.py) refuses
# a committed workflow that cannot contain an overlay's timeouts.
CHECK_DEADLINE = 600


def pipeline_timeouts(root: Path | None = None) -> Timeouts:
    """The widest `timeouts` of the committed overlays (overlays/*/release.yaml): one workflow runs them all."""
    root = root or Path(__file__).resolve().parents[2]
    specs = [parse_spec(read_yaml_file(f), f).timeouts for f in sorted((root / "overlays").glob("*/" + SPEC_FILE))]
    return Timeouts.widest(specs)


def deadlines(timeouts: Timeouts) -> dict[str, int]:
    """Template name -> activeDeadlineSeconds."""
    waits = timeouts.step_waits()

    def of(kind: str) -> int:
        return int(math.ceil(waits[kind] + STEP_MARGIN_S))
    return {"check": CHECK_DEADLINE, "rollout": of("rollout"), "validate": of("validate"), "promote": of("promote"),
            "rollback": of("rollback"), "skip-to-rollback": of("rollback"), "exit-rollback": of("rollback"),
            "validate-stable": of("validate"), "alert": 120,
            # run start waits for another run's Lease at most its duration + 60 s; run end deletes what the run
            # started (reference/baseline RayServices: their deletion is not waited for) and the Lease
            "lock": RUN_LEASE_S + 60 + STEP_MARGIN_S, "unlock": STEP_MARGIN_S}


DEADLINES = deadlines(pipeline_timeouts())
# check -> rollout -> validate -> promote | rollback; skip-to-rollback alone is shorter
WORKFLOW_DEADLINE = DEADLINES["lock"] + DEADLINES["check"] + DEADLINES["rollout"] + DEADLINES["validate"] + max(
    DEADLINES["promote"], DEADLINES["rollback"])
# validate-stable -> rollback | alert. Longer than the 30-min schedule: with concurrencyPolicy Forbid a
# run that restores the previous release is never cut short; the schedules that fall inside it are skipped.
CANARY_DEADLINE = DEADLINES["lock"] + DEADLINES["validate-stable"] + max(DEADLINES["rollback"], DEADLINES["alert"])
RETRY_LIMIT = 3
RETRY_BACKOFF_S = (30, 2)        # first wait, factor: 30 s, 60 s, 120 s
# Argo stops retrying once maxDuration has passed since the first try (operator.go
# processNodeRetries), so it must cover every try running to its deadline plus the waits.
RETRY_EXPRESSION = f"asInt(lastRetry.exitCode) == {EXIT_TRANSIENT}"


def _hera():
    from hera.workflows import models as m

    return m


def _retry(deadline: int):
    from hera.workflows import RetryStrategy
    from hera.workflows.models import Backoff

    first, factor = RETRY_BACKOFF_S
    waits = sum(first * factor ** i for i in range(RETRY_LIMIT))
    return RetryStrategy(limit=RETRY_LIMIT, retry_policy="Always", expression=RETRY_EXPRESSION,
                         backoff=Backoff(duration=f"{first}s", factor=factor,
                                         max_duration=f"{(RETRY_LIMIT + 1) * deadline + waits}s"))


def _security():
    m = _hera()
    pod = m.PodSecurityContext(run_as_non_root=True, run_as_user=RUN_AS_USER, run_as_group=RUN_AS_USER,
                               fs_group=RUN_AS_USER, seccomp_profile=m.SeccompProfile(type="RuntimeDefault"))
    container = m.SecurityContext(read_only_root_filesystem=True, allow_privilege_escalation=False,
                                  run_as_non_root=True, capabilities=m.Capabilities(drop=["ALL"]))
    return pod, container


def _volumes():
    m = _hera()
    return [m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource(size_limit="1Gi"))]


def _env():
    m = _hera()
    return [m.EnvVar(name="HOME", value=HOME), m.EnvVar(name="PDOPS_ENVIRONMENT", value=P % "environment"),
            m.EnvVar(name=RUN_ENV, value=RUN_ID)]


def _source():
    from hera.workflows import GitArtifact

    return GitArtifact(name="source", path=SRC, repo=P % "repo-url", revision=P % "revision", depth=1,
                       single_branch=False)


def _step(name: str, args: list[str], *, command: list[str] | None = None, checkout: bool = True,
          inputs: list | None = None, outputs: list | None = None, retry: bool = True,
          cpu: str = "250m", memory: str | None = None, api_key: bool = False):
    """A container template running `pdops ARGS` in the step image (api_key: with $PDOPS_API_KEY)."""
    from hera.workflows import Container

    m = _hera()
    _, csc = _security()
    memory = memory or STEP_MEMORY
    return Container(
        name=name,
        image=P % "step-image",
        command=command or ["pdops"],
        args=args,
        working_dir=SRC if checkout else "/tmp",
        env=_env() + ([m.EnvVar(name=API_KEY_ENV, value_from=m.EnvVarSource(
            secret_key_ref=m.SecretKeySelector(**API_KEY_SECRET, optional=True)))] if api_key else []),
        volume_mounts=[m.VolumeMount(name="tmp", mount_path="/tmp")],
        security_context=csc,
        inputs=([_source()] if checkout else []) + list(inputs or []),
        outputs=outputs or None,
        retry_strategy=_retry(DEADLINES[name]) if retry else None,
        active_deadline_seconds=DEADLINES[name],
        resources=m.ResourceRequirements(requests={"cpu": cpu, "memory": memory}, limits={"memory": memory}),
    )


def _lock_steps(remove_started: bool):
    """`pdops run start` (the run's first step takes the environment's Lease) and `pdops run end` (the exit
    handler releases it; with remove_started it first deletes the reference/baseline RayServices the run
    started). Neither needs the checkout: they name only the namespace."""
    lock_args = ["--run-id", RUN_ID, "--target", "kubernetes", "--namespace", ENV_NS]
    lock = _step("lock", ["run", "start", *lock_args], checkout=False)
    unlock = _step("unlock", ["run", "end", *lock_args, *(["--remove-started"] if remove_started else [])],
                   checkout=False)
    return lock, unlock


# Every exit-handler task after which the Lease is released, whatever it ended with.
ANY_END = "{t}.Succeeded || {t}.Failed || {t}.Errored || {t}.Skipped || {t}.Omitted"


def _outcome(default_verdict: str, default_summary: str, figures: bool = False) -> list:
    """The step's verdict and summary (and figures) as global output parameters; the defaults say
    what it means when the step died before writing them."""
    from hera.workflows import Parameter

    m = _hera()
    out = [Parameter(name="verdict", value_from=m.ValueFrom(path=f"{OUT}/verdict", default=default_verdict),
                     global_name="verdict"),
           Parameter(name="summary", value_from=m.ValueFrom(path=f"{OUT}/summary", default=default_summary),
                     global_name="summary")]
    if figures:
        out += [Parameter(name=f, value_from=m.ValueFrom(path=f"{OUT}/{f}", default="NaN"), global_name=f)
                for f in FIGURES]
    return out


def _metrics(metric_prefix: str):
    """Workflow-level Prometheus metrics, emitted on every path (promote, rollback, failed, blocked):
    the verdict counter always; the latency gauges when a gate measured them."""
    from hera.workflows import Counter, Gauge, Label

    env = Label(key="environment", value=P % "environment")
    verdict = "{{workflow.outputs.parameters.verdict}}"
    out: list[Gauge | Counter] = []
    for metric, series in GAUGES.items():
        for value, phase, quantile in series:
            out.append(Gauge(name=metric.replace("pd_release", metric_prefix), help=GAUGE_HELP[metric],
                             labels=[env, Label(key="phase", value=phase), Label(key="quantile", value=quantile)],
                             when=f"'{verdict}' == 'promote' || '{verdict}' == 'rollback'",
                             realtime=False, value="{{workflow.outputs.parameters." + value + "}}"))
    out.append(Counter(name=f"{metric_prefix}_verdict_total", help="verdicts by environment and workflow status",
                       labels=[env, Label(key="verdict", value=verdict),
                               Label(key="status", value="{{workflow.status}}")],
                       value="1"))
    return out


def _common_params(extra: list, image: str, environment: str = "dev") -> list:
    from hera.workflows import Parameter

    return [
        Parameter(name="environment", value=environment, enum=list(ENVIRONMENTS),
                  description="overlay to release: overlays/<environment>, namespace llm-<environment>"),
        *extra,
        Parameter(name="dry-run", value="false", enum=["false", "true"],
                  description="true: the API server validates and admits every object, nothing is stored"),
        Parameter(name="repo-url", value=REPO_URL, description="free text: the git repository holding the overlays"),
        Parameter(name="step-image", value=image, description="free text: the image running the pdops steps"),
    ]


def _run_spec(params: list, deadline: int, metric_prefix: str) -> dict:
    """What pd-release and pd-canary share below their own fields: the exit handler, the step account and
    security context, volumes, the run's deadline, the environment mutex (both write the same
    environment), pod GC and metrics."""
    m = _hera()
    pod_sc, _ = _security()
    return dict(
        on_exit="exit-handler",
        arguments=params,
        service_account_name=SERVICE_ACCOUNT,
        security_context=pod_sc,
        volumes=_volumes(),
        active_deadline_seconds=deadline,
        synchronization=m.Synchronization(mutexes=[m.Mutex(name="pd-release-" + P % "environment")]),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        metrics=_metrics(metric_prefix),
    )


def _run_artifact(optional: bool = True):
    from hera.workflows import Artifact

    return Artifact(name="run", path="/tmp/in/run", optional=optional)


def build_release(image: str = STEP_IMAGE):
    """WorkflowTemplate `pd-release`: one overlay at one git revision, proven before promotion."""
    from hera.workflows import DAG, Artifact, Parameter, Task, WorkflowTemplate

    m = _hera()
    params = _common_params([
        Parameter(name="revision", value="main", description="free text: git sha (or ref) to release"),
        Parameter(name="skip-to-rollback", value="false", enum=["false", "true"],
                  description="true: skip everything; drop a pending candidate and restore the last good release"),
    ], image)
    dry = "--dry-run=" + P % "dry-run"
    target = ["--target", "kubernetes", "--overlay", OVERLAY, "--namespace", ENV_NS]
    verdict = "{{tasks.validate.outputs.parameters.verdict}}"
    skip = P % "skip-to-rollback"

    with WorkflowTemplate(
        name="pd-release",
        namespace=WORKFLOW_NAMESPACE,
        labels={**PART_OF, "app.kubernetes.io/name": "pd-release"},
        annotations={"workflows.argoproj.io/description":
                     "Release one prefill/decode overlay at a git revision: check, rollout, validate (the "
                     "overlay's release.yaml decides what), then promote or roll back."},
        entrypoint="release",
        ttl_strategy=m.TTLStrategy(seconds_after_completion=7 * 24 * 3600),
        **_run_spec(params, WORKFLOW_DEADLINE, "pd_release"),
    ) as wt:
        check = _step("check", ["render", OVERLAY, "-o", f"{OUT}/manifest.yaml", "--outputs", OUT],
                      outputs=_outcome("blocked", "check did not finish: see the check step's log")
                      + [Artifact(name="manifest", path=f"{OUT}/manifest.yaml", optional=True),
                         Artifact(name="render-cache", path=RENDER_CACHE, optional=True)])
        rollout = _step("rollout", ["rollout", *target, "--revision", P % "revision", dry, "--outputs", OUT],
                        inputs=[Artifact(name="render-cache", path=RENDER_CACHE, optional=True)],
                        outputs=_outcome("failed", "rollout did not finish: see the rollout step's log"))
        validate = _step("validate", ["validate", *target, "--slot", "candidate", "--out", RUN, "--outputs", OUT],
                         cpu="1", memory=VALIDATE_MEMORY, api_key=True,
                         inputs=[Artifact(name="render-cache", path=RENDER_CACHE, optional=True)],
                         outputs=_outcome("failed", "validation did not finish: see the validate step's log", True)
                         + [Artifact(name="run", path=RUN, optional=True)])
        promote = _step("promote", ["promote", *target, dry, "--report", "/tmp/in/run"], inputs=[_run_artifact(False)])
        rollback = _step("rollback", ["rollback", *target, dry, "--report", "/tmp/in/run",
                                      "--reason", "the candidate did not pass validation"], inputs=[_run_artifact()])
        skip_rollback = _step("skip-to-rollback", ["rollback", *target, dry, "--reason",
                                                   "skip-to-rollback requested", "--outputs", OUT],
                              outputs=_outcome("failed", "rollback did not finish: see its log"))
        exit_rollback = _step("exit-rollback", ["rollback", *target, "--if-candidate-pending", dry, "--reason",
                                                "the workflow ended {{workflow.status}} with a candidate pending"])

        lock, unlock = _lock_steps(remove_started=False)   # exit-rollback removes what the run started

        run = [Artifact(name="run", from_="{{tasks.validate.outputs.artifacts.run}}", optional=True)]
        with DAG(name="release"):
            Task(name="lock", template=lock, when=f"{P % 'dry-run'} == false")
            Task(name="check", template=check, depends="lock.Succeeded || lock.Skipped", when=f"{skip} == false")
            Task(name="rollout", template=rollout, depends="check.Succeeded",
                 arguments=[Artifact(name="render-cache", from_="{{tasks.check.outputs.artifacts.render-cache}}",
                                     optional=True)])
            # rollout writes `unchanged` when the release already serves as stable (steps.settle_candidate):
            # a re-release is a no-op that succeeds, validate and promote are skipped
            # validate's diff reads the request fields check kept with Ray's verdict (render/diff_fields.py)
            Task(name="validate", template=validate, depends="rollout.Succeeded",
                 when=f"{P % 'dry-run'} == false && '{{{{tasks.rollout.outputs.parameters.verdict}}}}' != 'unchanged'",
                 arguments=[Artifact(name="render-cache", from_="{{tasks.check.outputs.artifacts.render-cache}}",
                                     optional=True)])
            Task(name="promote", template=promote, depends="validate.Succeeded", when=f"'{verdict}' == 'promote'",
                 arguments=run)
            Task(name="rollback", template=rollback, depends="validate.Succeeded || validate.Failed",
                 when=f"'{verdict}' != 'promote'", arguments=run)
            Task(name="skip-to-rollback", template=skip_rollback, depends="lock.Succeeded || lock.Skipped",
                 when=f"{skip} == true")

        with DAG(name="exit-handler"):
            Task(name="rollback-if-pending", template=exit_rollback, when="{{workflow.status}} != Succeeded")
            Task(name="unlock", template=unlock, depends=ANY_END.format(t="rollback-if-pending"),
                 when=f"{P % 'dry-run'} == false")

    return wt


def build_canary(image: str = STEP_IMAGE):
    """CronWorkflow `pd-canary`: re-validate the *stable* release; on regression roll back or alert."""
    from hera.workflows import DAG, Artifact, CronWorkflow, Parameter, Task

    m = _hera()
    params = _common_params([
        Parameter(name="revision", value="main",
                  description="free text: git ref checked out for pdops; the SLOs and model come from the "
                              "spec recorded with the serving release (ReleaseRecord.spec), not from this ref"),
        Parameter(name="on-regression", value="rollback", enum=["rollback", "alert"],
                  description="rollback (default): restore the good release before the stable one; "
                              "alert: fail the run and leave the stable release serving"),
    ], image, environment="prod")
    target = ["--target", "kubernetes", "--overlay", OVERLAY, "--namespace", ENV_NS]
    verdict = "{{tasks.validate-stable.outputs.parameters.verdict}}"
    on = P % "on-regression"

    with CronWorkflow(
        name="pd-canary",
        namespace=WORKFLOW_NAMESPACE,
        labels={**PART_OF, "app.kubernetes.io/name": "pd-canary"},
        schedules=["*/30 * * * *"],
        timezone="UTC",
        concurrency_policy="Forbid",
        starting_deadline_seconds=300,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=5,
        entrypoint="canary",
        **_run_spec(params, CANARY_DEADLINE, "pd_canary"),
    ) as cw:
        validate = _step("validate-stable", ["validate", *target, "--slot", "stable", "--out", RUN, "--outputs", OUT],
                         cpu="1", memory=VALIDATE_MEMORY, api_key=True,
                         outputs=_outcome("failed", "validation did not finish: see the validate step's log", True)
                         + [Artifact(name="run", path=RUN, optional=True)])
        # The stable release itself regressed: restore the good release before it.
        rollback = _step("rollback", ["rollback", *target, "--to-previous", "--report", "/tmp/in/run", "--reason",
                                      "pd-canary: stable release regressed", "--dry-run=" + P % "dry-run"],
                         inputs=[_run_artifact()])
        alert = _step("alert", ["echo \"pd-canary: stable release of $PDOPS_ENVIRONMENT: $VERDICT\" >&2; "
                                "printf '%s\\n' \"$SUMMARY\" >&2; exit 1"],
                      command=["sh", "-c"], checkout=False, retry=False,
                      inputs=[Parameter(name="summary"), Parameter(name="verdict")])
        alert.env = _env() + [m.EnvVar(name="SUMMARY", value="{{inputs.parameters.summary}}"),
                              m.EnvVar(name="VERDICT", value="{{inputs.parameters.verdict}}")]

        lock, unlock = _lock_steps(remove_started=True)

        with DAG(name="canary"):
            Task(name="lock", template=lock)
            Task(name="validate-stable", template=validate, depends="lock.Succeeded")
            # Only a verdict regresses the release; `failed` (validation could not run) alerts instead.
            Task(name="rollback", template=rollback, depends="validate-stable.Failed",
                 when=f"'{verdict}' == 'rollback' && {on} == rollback",
                 arguments=[Artifact(name="run", from_="{{tasks.validate-stable.outputs.artifacts.run}}",
                                     optional=True)])
            Task(name="alert", template=alert, depends="validate-stable.Failed",
                 when=f"'{verdict}' != 'rollback' || {on} == alert",
                 arguments=[Parameter(name="summary", value="{{tasks.validate-stable.outputs.parameters.summary}}"),
                            Parameter(name="verdict", value=verdict)])

        # whatever the run ended with (killed, deadline, crash): the reference/baseline RayServices it started
        # are deleted and the Lease released (exit-handler pods ignore the workflow deadline: workflowpod.go)
        with DAG(name="exit-handler"):
            Task(name="cleanup", template=unlock)
    return cw


def _dump(objects: list[dict[str, Any]]) -> str:
    header = ("# Generated by `pdops workflows render --out kustomize/argo` (workflows/argo/definitions.py). "
              "Do not edit.\n")
    return header + "".join("---\n" + yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)


def release_objects() -> list[dict[str, Any]]:
    return [build_release().to_dict()]


def canary_objects() -> list[dict[str, Any]]:
    return [build_canary().to_dict()]


def render_objects() -> dict[str, list[dict[str, Any]]]:
    from workflows.argo import events, rbac

    return {"pd-release.yaml": release_objects(), "pd-canary.yaml": canary_objects(),
            "events.yaml": events.objects(), "rbac.yaml": rbac.objects()}


def render_all() -> dict[str, str]:
    """File name -> YAML text, exactly what is committed under kustomize/argo/."""
    files = {name: _dump(objs) for name, objs in render_objects().items()}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": sorted(files)}
    files["kustomization.yaml"] = _dump([kustomization])
    return files


def cmd_render(args: argparse.Namespace) -> int:
    import sys

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {out / name}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """`pdops workflows render --out DIR`."""
    p = subparsers.add_parser("workflows", help="the Argo Workflows/Events/RBAC manifests of the pipeline")
    actions = p.add_subparsers(dest="workflows_action", required=True, metavar="ACTION")
    r = actions.add_parser("render", help="write pd-release, pd-canary, events, rbac and a kustomization")
    r.add_argument("--out", default="kustomize/argo", help="output directory (default: kustomize/argo)")
    r.set_defaults(func=cmd_render)
