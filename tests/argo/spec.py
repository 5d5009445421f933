"""The Argo Workflows objects the tier executes, as Pydantic models with `extra="forbid"`: a field the
YAML uses that is not declared here raises at load, so a new Argo feature cannot be ignored silently.

Fields are of three kinds:
- emulated (the engine acts on them; see engine.py / pod.py for the upstream function of each);
- ACCEPTED_NOT_EMULATED: declared so the committed YAML loads, listed in docs/argo.md as not (fully)
  emulated (images, security context, resources and RBAC as far as pod.py goes, garbage collection);
- anything else: ValidationError naming the field.
Field names and shapes follow pkg/apis/workflow/v1alpha1/workflow_types.go (v4.0.10).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ACCEPTED_NOT_EMULATED = {
    "container.image": "no images here: every container runs the step image's install (pod.py)",
    "container.resources": "limits.memory is enforced by a watcher of RSS (pod.py); cpu and requests are not",
    "container.securityContext": "applied but seccomp (pod.py: user, capabilities, no_new_privs, read-only root)",
    "spec.securityContext": "runAsUser/runAsGroup/runAsNonRoot/fsGroup applied (pod.py); seccomp is not",
    "spec.serviceAccountName": "the step's KUBECONFIG carries its token; RBAC enforced where the cluster does (pod.py)",
    "spec.podGC": "no pods to collect",
    "spec.ttlStrategy": "no Workflow objects to delete",
    "volumes.emptyDir.sizeLimit": "the emptyDir is a host directory without a size limit",
    "artifact.git.depth/singleBranch": "the checkout is `git archive REV` of the local repository",
    "parameter.description": "documentation only",
}


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ValueFrom(_M):
    path: str | None = None
    default: str | None = None


class Parameter(_M):
    name: str
    value: str | None = None
    default: str | None = None
    enum: list[str] | None = None
    description: str | None = None
    valueFrom: ValueFrom | None = None
    globalName: str | None = None


class GitArtifact(_M):
    repo: str
    revision: str | None = None
    depth: int | None = None
    singleBranch: bool | None = None


class Artifact(_M):
    name: str
    path: str | None = None
    from_: str | None = Field(default=None, alias="from")
    git: GitArtifact | None = None
    globalName: str | None = None
    optional: bool | None = None


class IO(_M):
    parameters: list[Parameter] = []
    artifacts: list[Artifact] = []


class SecretKeyRef(_M):
    name: str
    key: str
    optional: bool | None = None


class EnvSource(_M):
    secretKeyRef: SecretKeyRef


class EnvVar(_M):
    name: str
    value: str | None = None
    valueFrom: EnvSource | None = None


class VolumeMount(_M):
    name: str
    mountPath: str


class Container(_M):
    image: str
    command: list[str] | None = None
    args: list[str] = []
    env: list[EnvVar] = []
    workingDir: str | None = None
    volumeMounts: list[VolumeMount] = []
    resources: dict[str, Any] | None = None
    securityContext: dict[str, Any] | None = None


class Backoff(_M):
    duration: str
    factor: int | None = None
    maxDuration: str | None = None
    cap: str | None = None


class RetryStrategy(_M):
    limit: int | None = None
    retryPolicy: Literal["Always", "OnFailure", "OnError"] | None = None  # OnTransientError: not emulated
    expression: str | None = None
    backoff: Backoff | None = None


class Arguments(_M):
    parameters: list[Parameter] = []
    artifacts: list[Artifact] = []


class DAGTask(_M):
    name: str
    template: str
    depends: str | None = None
    when: str | None = None
    arguments: Arguments = Arguments()


class DAG(_M):
    tasks: list[DAGTask]


class Template(_M):
    name: str
    container: Container | None = None
    dag: DAG | None = None
    inputs: IO = IO()
    outputs: IO = IO()
    retryStrategy: RetryStrategy | None = None
    activeDeadlineSeconds: int | None = None


class MetricLabel(_M):
    key: str
    value: str


class Gauge(_M):
    value: str
    realtime: bool | None = None


class Counter(_M):
    value: str


class Prometheus(_M):
    name: str
    help: str
    labels: list[MetricLabel] = []
    gauge: Gauge | None = None
    counter: Counter | None = None
    when: str | None = None


class Metrics(_M):
    prometheus: list[Prometheus]


class Mutex(_M):
    name: str


class Synchronization(_M):
    mutexes: list[Mutex]


class EmptyDir(_M):
    sizeLimit: str | None = None


class Volume(_M):
    name: str
    emptyDir: EmptyDir


class TemplateRef(_M):
    name: str


class WorkflowSpec(_M):
    entrypoint: str | None = None
    arguments: Arguments = Arguments()
    templates: list[Template] = []
    onExit: str | None = None
    metrics: Metrics | None = None
    synchronization: Synchronization | None = None
    volumes: list[Volume] = []
    activeDeadlineSeconds: int | None = None
    workflowTemplateRef: TemplateRef | None = None
    serviceAccountName: str | None = None
    securityContext: dict[str, Any] | None = None
    podGC: dict[str, Any] | None = None
    ttlStrategy: dict[str, Any] | None = None

    def template(self, name: str) -> Template:
        for t in self.templates:
            if t.name == name:
                return t
        raise KeyError(name)


class CronSpec(_M):
    """CronWorkflow.spec: only workflowSpec is executed; the schedule fields say when the cron
    controller (workflow/cron/operator.go) would submit it, which the tier replaces by a direct run."""
    schedules: list[str]
    timezone: str | None = None
    concurrencyPolicy: Literal["Allow", "Forbid", "Replace"] | None = None
    startingDeadlineSeconds: int | None = None
    successfulJobsHistoryLimit: int | None = None
    failedJobsHistoryLimit: int | None = None
    workflowSpec: WorkflowSpec


def load_workflow_spec(doc: dict[str, Any]) -> WorkflowSpec:
    """WorkflowTemplate / Workflow -> spec; CronWorkflow -> spec.workflowSpec (ConvertCronWorkflowToWorkflow)."""
    kind = doc.get("kind")
    if kind in ("WorkflowTemplate", "Workflow"):
        return WorkflowSpec.model_validate(doc["spec"])
    if kind == "CronWorkflow":
        return CronSpec.model_validate(doc["spec"]).workflowSpec
    raise ValueError(f"not an Argo workflow object: kind {kind!r}")
