"""The Argo side of the pipeline: `pd-release` (WorkflowTemplate) and `pd-canary` (CronWorkflow), built with Hera.

Nothing here talks to a cluster. `render_all()` returns the YAML committed under `kustomize/argo/`;
`pdops workflows render --out kustomize/argo` rewrites it (a unit test fails when the two drift).

Every step is a container running the project's CLI in the step image (see /Dockerfile). The release
DAG is:

    build-config -> check -> rollout -> (compat || bench) -> gate -> promote   (verdict == promote)
                                                                  \\-> rollback (otherwise)
    skip-to-rollback=true: only `skip-to-rollback` (the rollback template) runs.

Retries (with backoff) only on read-only steps; none on rollout/promote/rollback, which change the
cluster. The exit handler rolls a pending candidate back when the workflow did not succeed.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from validation.server_metrics import RAY_METRICS_LAG_S
from workflows.names import (API_KEY_ENV, API_KEY_SECRET, ENV_NAMESPACES, ENVIRONMENTS, SERVICE_ACCOUNT,  # noqa: F401
                             WORKFLOW_NAMESPACE)

STEP_IMAGE = "ghcr.io/pdops/pdops-step:0.1.0"
REPO_URL = "https://github.com/pdops/pdops.git"
PROFILES = ("balanced", "long-prompt-short-output", "short-prompt-long-output")
SRC = "/workspace/src"          # git input artifact (the revision under release)
RUN_AS_USER = 10001              # matches the Dockerfile's user

P = "{{workflow.parameters.%s}}"
OVERLAY = "overlays/" + P % "environment"
ENV_NS = "llm-" + P % "environment"   # overlays/<env> use namespace llm-<env> (see ENV_NAMESPACES)
# Validation reaches the slot it judges (the candidate in pd-release, stable in pd-canary) at the
# URLs `pdops endpoint` reports: the colour's own serve and head Services, never the stable route.
BASE_URL = "{{inputs.parameters.base-url}}"
METRICS_URL = "{{inputs.parameters.metrics-url}}"
METRICS_LAG = ("--metrics-lag-s", f"{RAY_METRICS_LAG_S:g}")   # the RayService's metrics are up to 10 s old
MODEL = "{{inputs.parameters.model}}"   # from the facts step (model.id of overlays/<env>/release.yaml)

# `pdops workflows gate-outputs` writes one file per value under the gate's --out directory
# (from report.json); they become (global) output parameters and feed the Prometheus metrics.
GATE_VALUES = ("verdict", "ttft-p50-ms", "ttft-p99-ms", "itl-p50-ms", "itl-p99-ms", "kv-prompt-tokens")
GAUGES = {  # metric name -> [(gate output, phase, quantile)]
    "pd_release_ttft_ms": [("ttft-p50-ms", "prefill", "p50"), ("ttft-p99-ms", "prefill", "p99")],
    "pd_release_itl_ms": [("itl-p50-ms", "decode", "p50"), ("itl-p99-ms", "decode", "p99")],
    "pd_release_kv_prompt_tokens": [("kv-prompt-tokens", "kv-transfer", "total")],
}
GAUGE_HELP = {"pd_release_ttft_ms": "time to first token (ms) measured by the gate's bench, by phase and quantile",
              "pd_release_itl_ms": "inter-token latency (ms) measured by the gate's bench, by phase and quantile",
              "pd_release_kv_prompt_tokens": "prompt tokens that arrived by NIXL KV transfer during the bench"}

# per-step timeouts (activeDeadlineSeconds)
DEADLINES = {"stable-endpoint": 300, "build-config": 300, "check": 600, "rollout": 1800, "compat": 900, "bench": 1800,
             "gate": 300, "facts": 300, "promote": 900, "rollback": 900, "exit-rollback": 900, "alert": 120}
WORKFLOW_DEADLINE = 4 * 3600
CANARY_DEADLINE = 1500
RETRIED = ("build-config", "check", "compat", "bench", "stable-endpoint")   # read-only: safe to retry
NOT_RETRIED = ("rollout", "promote", "rollback", "exit-rollback")


def _hera():
    from hera.workflows import models as m

    return m


def _retry():
    from hera.workflows import RetryStrategy
    from hera.workflows.models import Backoff

    return RetryStrategy(limit=3, retry_policy="Always",
                         backoff=Backoff(duration="15s", factor=2, max_duration="5m"))


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
    return [m.EnvVar(name="HOME", value="/tmp"), m.EnvVar(name="PDOPS_ENVIRONMENT", value=P % "environment")]


def _source():
    from hera.workflows import GitArtifact

    return GitArtifact(name="source", path=SRC, repo=P % "repo-url", revision=P % "revision", depth=1,
                       single_branch=False)


def _step(name: str, args: list[str], *, command: list[str] | None = None, checkout: bool = True,
          inputs: list | None = None, outputs: list | None = None, retry: bool = False,
          cpu: str = "250m", memory: str = "512Mi", deadline: int | None = None, api_key: bool = False):
    """A container template running `pdops ARGS` in the step image (api_key: with $PDOPS_API_KEY)."""
    from hera.workflows import Container

    m = _hera()
    _, csc = _security()
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
        retry_strategy=_retry() if retry else None,
        active_deadline_seconds=deadline or DEADLINES[name],
        resources=m.ResourceRequirements(requests={"cpu": cpu, "memory": memory}, limits={"memory": memory}),
    )


def _gate_script(extra: str = "") -> str:
    """`pdops gate` (exit 0 promote, 1 rollback, 2 bad input), then export its decision as files."""
    return ("pdops gate --compat /tmp/in/compat.json --bench /tmp/in/bench.json " + extra +
            "--release \"overlays/$PDOPS_ENVIRONMENT/release.yaml\" --out /tmp/report "
            "--json /tmp/report/decision.json; rc=$?; "
            "exec pdops workflows gate-outputs --report /tmp/report --exit-code \"$rc\"")


def _gate_outputs(global_prefix: str):
    from hera.workflows import Artifact, Parameter

    m = _hera()
    params = [Parameter(name=v, value_from=m.ValueFrom(path=f"/tmp/report/{v}",
                                                        default="rollback" if v == "verdict" else "0"),
                        global_name=f"{global_prefix}{v}")
              for v in GATE_VALUES]
    params.append(Parameter(name="summary", value_from=m.ValueFrom(path="/tmp/report/summary.md",
                                                                    default="(no summary written)"),
                            global_name=f"{global_prefix}summary"))
    return params + [Artifact(name="report", path="/tmp/report", global_name=f"{global_prefix}report")]


def _metrics(prefix: str, metric_prefix: str):
    """Workflow-level Prometheus metrics from the gate's global output parameters."""
    from hera.workflows import Counter, Gauge, Label

    env = Label(key="environment", value=P % "environment")
    out = []
    for metric, series in GAUGES.items():
        for value, phase, quantile in series:
            out.append(Gauge(name=metric.replace("pd_release", metric_prefix),
                             help=GAUGE_HELP[metric],
                             labels=[env, Label(key="phase", value=phase), Label(key="quantile", value=quantile)],
                             realtime=False, value="{{workflow.outputs.parameters.%s%s}}" % (prefix, value)))
    out.append(Counter(name=f"{metric_prefix}_verdict_total", help="gate verdicts by environment",
                       labels=[env, Label(key="verdict", value="{{workflow.outputs.parameters.%sverdict}}" % prefix),
                               Label(key="status", value="{{workflow.status}}")],
                       value="1"))
    return out


def _common_params(extra: list) -> list:
    from hera.workflows import Parameter

    return [
        Parameter(name="environment", value="dev", enum=list(ENVIRONMENTS),
                  description="overlay to release: overlays/<environment>"),
        *extra,
        Parameter(name="repo-url", value=REPO_URL, description="git repository holding the overlays"),
        Parameter(name="step-image", value=STEP_IMAGE, description="image running the pdops steps"),
    ]


def _endpoint_outputs() -> list:
    """`pdops endpoint`'s files (--out / --endpoint-out /tmp/endpoint) as output parameters."""
    from hera.workflows import Parameter

    m = _hera()
    return [Parameter(name=n, value_from=m.ValueFrom(path=f"/tmp/endpoint/{n}")) for n in ("base-url", "metrics-url")]


def _endpoint_args(task: str) -> list:
    from hera.workflows import Parameter

    return [Parameter(name=n, value="{{tasks.%s.outputs.parameters.%s}}" % (task, n))
            for n in ("base-url", "metrics-url")]


def _validation_inputs() -> list:
    from hera.workflows import Parameter

    return [Parameter(name=n) for n in ("model", "base-url", "metrics-url")]


def build_release(image: str = STEP_IMAGE):
    """WorkflowTemplate `pd-release`: one overlay at one git revision, proven before promotion."""
    from hera.workflows import DAG, Artifact, Parameter, Task, WorkflowTemplate

    m = _hera()
    pod_sc, _ = _security()
    params = _common_params([
        Parameter(name="revision", value="main", description="git sha (or ref) to release"),
        Parameter(name="dry-run", value="false", enum=["false", "true"],
                  description="render and validate only; rollout/promote/rollback run with --dry-run"),
        Parameter(name="skip-to-rollback", value="false", enum=["false", "true"],
                  description="skip everything and roll the environment back"),
        Parameter(name="validation-profile", value="balanced", enum=list(PROFILES),
                  description="workload shape for bench and gate"),
    ])
    for p in params:
        if p.name == "step-image":
            p.value = image
    dry = "--dry-run=" + P % "dry-run"
    base = ["--base-url", BASE_URL, "--api-key-env", API_KEY_ENV]
    target = ["--target", "kubernetes", "--overlay", OVERLAY, "--namespace", ENV_NS]
    verdict = "{{tasks.gate.outputs.parameters.verdict}}"
    skip = P % "skip-to-rollback"

    with WorkflowTemplate(
        name="pd-release",
        namespace=WORKFLOW_NAMESPACE,
        labels={"app.kubernetes.io/part-of": "pdops", "app.kubernetes.io/name": "pd-release"},
        annotations={"workflows.argoproj.io/description":
                     "Release one prefill/decode overlay at a git revision: build-config, check, rollout, "
                     "compat+bench, gate, then promote or roll back."},
        entrypoint="release",
        on_exit="exit-handler",
        arguments=params,
        service_account_name=SERVICE_ACCOUNT,
        security_context=pod_sc,
        volumes=_volumes(),
        active_deadline_seconds=WORKFLOW_DEADLINE,
        synchronization=m.Synchronization(mutexes=[m.Mutex(name="pd-release-" + P % "environment")]),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_completion=7 * 24 * 3600),
        metrics=_metrics("", "pd_release"),
    ) as wt:
        build_config = _step("build-config", [
            "set -eu; pdops build-config \"overlays/$PDOPS_ENVIRONMENT\" --json > /tmp/serve-config.json; "
            "pdops workflows facts \"overlays/$PDOPS_ENVIRONMENT\" --out /tmp/facts"],
            command=["sh", "-c"], retry=True,
            outputs=[Parameter(name="model", value_from=m.ValueFrom(path="/tmp/facts/model")),
                     Artifact(name="serve-config", path="/tmp/serve-config.json")])
        check = _step("check", [
            "set -eu; pdops render \"overlays/$PDOPS_ENVIRONMENT\" -o /tmp/rendered.yaml; "
            "pdops check -f /tmp/rendered.yaml --json > /tmp/check.json"],
            command=["sh", "-c"], retry=True,
            outputs=[Artifact(name="rendered", path="/tmp/rendered.yaml"),
                     Artifact(name="check", path="/tmp/check.json")])
        rollout = _step("rollout", ["rollout", *target, "--revision", P % "revision", dry,
                                    "--endpoint-out", "/tmp/endpoint"], outputs=_endpoint_outputs())
        compat = _step("compat", ["compat", *base, "--model", MODEL, "--json", "/tmp/compat.json"],
                       checkout=False, retry=True, inputs=_validation_inputs(), api_key=True,
                       outputs=[Artifact(name="compat", path="/tmp/compat.json")])
        # 300 requests: the fewest with which the gate proves a p99 or an unchanged vs_stable candidate at
        # 95% (128 rolled back 35% of unchanged candidates: README, A gate that knows how sure it is)
        bench = _step("bench", ["bench", *base, "--model", MODEL, "--profile", P % "validation-profile",
                                "--concurrency", "8", "--requests", "300", "--warmup", "4",
                                "--metrics-url", METRICS_URL, *METRICS_LAG, "--json", "/tmp/bench.json"],
                      checkout=False, retry=True, cpu="1", memory="1Gi", inputs=_validation_inputs(),
                      api_key=True, outputs=[Artifact(name="bench", path="/tmp/bench.json")])
        gate = _step("gate", [_gate_script()], command=["sh", "-c"],
                     inputs=[Artifact(name="compat", path="/tmp/in/compat.json"),
                             Artifact(name="bench", path="/tmp/in/bench.json")],
                     outputs=_gate_outputs(""))
        promote = _step("promote", ["promote", *target, dry])
        rollback = _step("rollback", ["rollback", *target, dry])
        exit_rollback = _step("exit-rollback", ["rollback", *target, "--if-candidate-pending", dry])

        model_arg = [Parameter(name="model", value="{{tasks.build-config.outputs.parameters.model}}"),
                     *_endpoint_args("rollout")]
        with DAG(name="release"):
            Task(name="build-config", template=build_config, when=f"{skip} == false")
            Task(name="check", template=check, depends="build-config.Succeeded")
            Task(name="rollout", template=rollout, depends="check.Succeeded")
            Task(name="compat", template=compat, depends="rollout.Succeeded", arguments=model_arg)
            Task(name="bench", template=bench, depends="rollout.Succeeded", arguments=model_arg)
            Task(name="gate", template=gate, depends="compat.Succeeded && bench.Succeeded",
                 arguments=[Artifact(name="compat", from_="{{tasks.compat.outputs.artifacts.compat}}"),
                            Artifact(name="bench", from_="{{tasks.bench.outputs.artifacts.bench}}")])
            Task(name="promote", template=promote, depends="gate.Succeeded", when=f"'{verdict}' == 'promote'")
            Task(name="rollback", template=rollback, depends="gate.Succeeded || gate.Failed",
                 when=f"'{verdict}' != 'promote'")
            Task(name="skip-to-rollback", template=rollback, when=f"{skip} == true")

        with DAG(name="exit-handler"):
            Task(name="rollback-if-pending", template=exit_rollback, when="{{workflow.status}} != Succeeded")

    return wt


def build_canary(image: str = STEP_IMAGE):
    """CronWorkflow `pd-canary`: re-validate the *stable* release; on regression roll back or alert."""
    from hera.workflows import DAG, Artifact, CronWorkflow, Parameter, Task

    m = _hera()
    pod_sc, _ = _security()
    params = _common_params([
        Parameter(name="revision", value="main", description="git ref of the stable release's overlay"),
        Parameter(name="on-regression", value="alert", enum=["rollback", "alert"],
                  description="what to do when the stable release regressed"),
        Parameter(name="validation-profile", value="balanced", enum=list(PROFILES)),
        Parameter(name="dry-run", value="false", enum=["false", "true"]),
    ])
    for p in params:
        if p.name == "step-image":
            p.value = image
        if p.name == "environment":
            p.value = "prod"    # the stable release users hit; on-regression defaults to alert
    base = ["--base-url", BASE_URL, "--api-key-env", API_KEY_ENV]
    target = ["--target", "kubernetes", "--overlay", OVERLAY, "--namespace", ENV_NS]
    verdict = "{{tasks.gate.outputs.parameters.verdict}}"
    regressed = f"'{verdict}' != 'promote'"

    with CronWorkflow(
        name="pd-canary",
        namespace=WORKFLOW_NAMESPACE,
        labels={"app.kubernetes.io/part-of": "pdops", "app.kubernetes.io/name": "pd-canary"},
        schedules=["*/30 * * * *"],
        timezone="UTC",
        concurrency_policy="Forbid",
        starting_deadline_seconds=300,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=5,
        entrypoint="canary",
        arguments=params,
        service_account_name=SERVICE_ACCOUNT,
        security_context=pod_sc,
        volumes=_volumes(),
        active_deadline_seconds=CANARY_DEADLINE,
        synchronization=m.Synchronization(mutexes=[m.Mutex(name="pd-release-" + P % "environment")]),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        metrics=_metrics("canary-", "pd_canary"),
    ) as cw:
        facts = _step("facts", ["workflows", "facts", OVERLAY, "--out", "/tmp/facts"], retry=True,
                      outputs=[Parameter(name="model", value_from=m.ValueFrom(path="/tmp/facts/model"))])
        compat = _step("compat", ["compat", *base, "--model", MODEL, "--json", "/tmp/compat.json"],
                       checkout=False, retry=True, inputs=_validation_inputs(), api_key=True,
                       outputs=[Artifact(name="compat", path="/tmp/compat.json")])
        bench = _step("bench", ["bench", *base, "--model", MODEL, "--profile", P % "validation-profile",
                                "--concurrency", "4", "--requests", "16", "--metrics-url", METRICS_URL,
                                *METRICS_LAG, "--json", "/tmp/bench.json"],
                      checkout=False, retry=True, inputs=_validation_inputs(), deadline=600,
                      api_key=True, outputs=[Artifact(name="bench", path="/tmp/bench.json")])
        # 16 requests prove no p90 (29 needed) nor p99 (299): judged on point estimates, as before the
        # gate had intervals, so an unprovable check never rolls the stable release back by itself
        gate = _step("gate", [_gate_script("--inconclusive point_estimate ")], command=["sh", "-c"],
                     inputs=[Artifact(name="compat", path="/tmp/in/compat.json"),
                             Artifact(name="bench", path="/tmp/in/bench.json")],
                     outputs=_gate_outputs("canary-"))
        # The stable release itself regressed: restore the good release before it.
        rollback = _step("rollback", ["rollback", *target, "--to-previous", "--reason",
                                      "pd-canary: stable release regressed", "--dry-run=" + P % "dry-run"])
        alert = _step("alert", ["echo \"pd-canary: stable release of $PDOPS_ENVIRONMENT regressed\" >&2; "
                                "printf '%s\\n' \"$SUMMARY\" >&2; exit 1"],
                      command=["sh", "-c"], checkout=False,
                      inputs=[Parameter(name="summary")])
        alert.env = _env() + [m.EnvVar(name="SUMMARY", value="{{inputs.parameters.summary}}")]

        stable_endpoint = _step("stable-endpoint", ["endpoint", "--slot", "stable", *target, "--out", "/tmp/endpoint"],
                                retry=True, outputs=_endpoint_outputs())
        model_arg = [Parameter(name="model", value="{{tasks.facts.outputs.parameters.model}}"),
                     *_endpoint_args("stable-endpoint")]
        with DAG(name="canary"):
            Task(name="facts", template=facts)
            Task(name="stable-endpoint", template=stable_endpoint)
            ready = "facts.Succeeded && stable-endpoint.Succeeded"
            Task(name="compat", template=compat, depends=ready, arguments=model_arg)
            Task(name="bench", template=bench, depends=ready, arguments=model_arg)
            Task(name="gate", template=gate, depends="compat.Succeeded && bench.Succeeded",
                 arguments=[Artifact(name="compat", from_="{{tasks.compat.outputs.artifacts.compat}}"),
                            Artifact(name="bench", from_="{{tasks.bench.outputs.artifacts.bench}}")])
            Task(name="rollback", template=rollback, depends="gate.Succeeded || gate.Failed",
                 when=f"{regressed} && {P % 'on-regression'} == rollback")
            Task(name="alert", template=alert, depends="gate.Succeeded || gate.Failed",
                 when=f"{regressed} && {P % 'on-regression'} == alert",
                 arguments=[Parameter(name="summary", value="{{tasks.gate.outputs.parameters.summary}}")])
    return cw


def _dump(objects: list[dict[str, Any]]) -> str:
    header = "# Generated by `pdops workflows render --out kustomize/argo` (workflows/argo.py). Do not edit.\n"
    return header + "".join("---\n" + yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)


def release_objects() -> list[dict[str, Any]]:
    return [build_release().to_dict()]


def canary_objects() -> list[dict[str, Any]]:
    return [build_canary().to_dict()]


def render_objects() -> dict[str, list[dict[str, Any]]]:
    from workflows import events, rbac

    return {"pd-release.yaml": release_objects(), "pd-canary.yaml": canary_objects(),
            "events.yaml": events.objects(), "rbac.yaml": rbac.objects()}


def render_all() -> dict[str, str]:
    """filename -> YAML text, exactly what is committed under kustomize/argo/."""
    files = {name: _dump(objs) for name, objs in render_objects().items()}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": sorted(files)}
    files["kustomization.yaml"] = _dump([kustomization])
    return files


def facts(overlay: Path) -> dict[str, str]:
    """Values later steps need from the overlay's release spec (one file each under --out)."""
    from workflows.spec import load_spec

    spec = load_spec(Path(overlay))
    return {"model": spec.model.id, "name": spec.name}


def gate_outputs(report: dict[str, Any], exit_code: int) -> dict[str, str]:
    """The gate's verdict and headline latencies (first bench), as output-parameter files."""
    verdict = report.get("verdict") or ("promote" if exit_code == 0 else "rollback")
    benches = report.get("benches") or [{}]
    bench = benches[0] if isinstance(benches[0], dict) else {}

    def num(*path: str) -> str:
        d: Any = bench
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        return f"{float(d):g}" if isinstance(d, (int, float)) else "0"

    return {"verdict": verdict if verdict in ("promote", "rollback") else "rollback",
            "ttft-p50-ms": num("ttft_ms", "p50"), "ttft-p99-ms": num("ttft_ms", "p99"),
            "itl-p50-ms": num("itl_ms", "p50"), "itl-p99-ms": num("itl_ms", "p99"),
            "kv-prompt-tokens": num("server", "kv", "external_kv_prompt_tokens")}


def cmd_facts(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, value in facts(Path(args.overlay)).items():
        (out / name).write_text(value, encoding="utf-8")
    return 0


def cmd_gate_outputs(args: argparse.Namespace) -> int:
    """Exit 0 when the gate decided (promote or rollback), its own code when it could not decide."""
    import json
    import sys

    out = Path(args.report)
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = {}
    for name, value in gate_outputs(report, args.exit_code).items():
        (out / name).write_text(value, encoding="utf-8")
    if not (out / "summary.md").exists():
        (out / "summary.md").write_text(f"# Validation: gate exited {args.exit_code} without a report\n",
                                        encoding="utf-8")
    print(f"verdict: {(out / 'verdict').read_text()}", file=sys.stderr)
    return 0 if args.exit_code in (0, 1) and report else (args.exit_code or 1)


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
    f = actions.add_parser("facts", help="(step helper) write model id etc. of an overlay, one file each")
    f.add_argument("overlay")
    f.add_argument("--out", required=True)
    f.set_defaults(func=cmd_facts)
    g = actions.add_parser("gate-outputs", help="(step helper) export a gate report as output-parameter files")
    g.add_argument("--report", required=True, help="the gate's --out directory")
    g.add_argument("--exit-code", type=int, required=True, help="exit code of `pdops gate`")
    g.set_defaults(func=cmd_gate_outputs)
