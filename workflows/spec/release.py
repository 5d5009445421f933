"""ReleaseSpec: the one file per environment that platform teams edit (overlays/<env>/release.yaml).

Everything downstream (serve config, manifest, checks, validation) is derived from it plus the
overlay's kustomization, so a typo here must fail loudly with the file and field named.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from validation.config import SLO, Validation
from validation.diff import known, scenarios
from validation.yaml_input import field_path, read_yaml_file
from workflows.errors import InputError
from workflows.spec import tiny_model

SPEC_FILE = "release.yaml"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Parts of an environment variable name that say it holds a credential (HF_TOKEN, VLLM_API_KEY, ...).
SECRET_NAME_PARTS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "APIKEY", "CREDENTIALS"}
INT32_MAX = 2**31 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class Architecture(_Strict):
    """The model's shape, for sizing (`pdops size`, `pdops check`): the values of its config.json."""

    parameters: float = Field(gt=0, le=1e13, allow_inf_nan=False)    # count, e.g. 70.6e9
    layers: PositiveInt = Field(le=1024)                              # num_hidden_layers
    kv_heads: PositiveInt = Field(le=1024)                            # num_key_value_heads
    head_dim: PositiveInt = Field(le=4096)                            # head_dim (hidden_size / heads)
    dtype: Literal["float32", "bfloat16", "float16", "fp8", "int8", "int4"] = "bfloat16"  # of the weights
    source: str | None = Field(None, max_length=500)                  # where the values come from

    @property
    def weight_bytes(self) -> float:
        return self.parameters * DTYPE_BYTES[self.dtype]


class Model(_Strict):
    id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
    # A path or URI the engine loads; `tiny-model://NAME` is built locally by `pdops tiny-model`.
    source: str = Field(min_length=1, max_length=1000)
    max_model_len: PositiveInt | None = Field(None, le=INT32_MAX)
    # The model's own context limit (config.json max_position_embeddings), where known.
    max_position_embeddings: PositiveInt | None = Field(None, le=INT32_MAX)
    # Optional: without it, sizing reads config.json of a local model directory (or the tiny model).
    architecture: Architecture | None = None

    @field_validator("source")
    @classmethod
    def _tiny_model_name(cls, source: str) -> str:
        if source.startswith(tiny_model.SCHEME):
            tiny_model.check_name(source.removeprefix(tiny_model.SCHEME))
        return source


class Accelerator(_Strict):
    kind: Literal["gpu", "cpu"] = "gpu"
    # Ray accelerator type of the GPU nodes (e.g. H100, A100, L40S); not used on CPU.
    type: str | None = Field(None, max_length=64)


class KVTransfer(_Strict):
    connector: str = Field("NixlConnector", max_length=128)
    # NIXL transport backends. On EFA, LIBFABRIC is required: UCX falls back to TCP silently.
    backends: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(["UCX"], max_length=8)
    buffer_device: Literal["cuda", "cpu"] = "cuda"


class Autoscaling(_Strict):
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: PositiveInt = Field(1, le=1000)
    target_ongoing_requests: PositiveInt = Field(16, le=100000)

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class Phase(_Strict):
    """How one phase (prefill or decode) is sized. Each replica is one vLLM engine."""

    tensor_parallel_size: PositiveInt = Field(1, le=64)
    # Pipeline stages per replica (vLLM's pipeline_parallel_size): each stage holds layers/PP of the
    # model on TP GPUs, so one replica takes TP x PP GPUs and, past one pod's GPUs, spans
    # TP x PP / (GPUs per pod) worker pods (nodes). TP stays within a node, PP crosses nodes
    # (vLLM's Ray executor orders ranks node by node, vllm/v1/executor/ray_executor.py
    # sort_by_driver_then_worker_ip, and builds pp_tp_workers as [pp_rank][tp_rank]).
    pipeline_parallel_size: PositiveInt = Field(1, le=64)
    replicas: PositiveInt | None = Field(None, le=1000)
    autoscaling: Autoscaling | None = None
    max_ongoing_requests: PositiveInt = Field(64, le=100000)
    # Extra vLLM engine arguments for this phase, merged over the generated ones.
    engine_kwargs: dict[str, Any] = {}
    env: dict[Annotated[str, Field(pattern=ENV_NAME)], Annotated[str, Field(max_length=32768)]] = {}

    @field_validator("engine_kwargs")
    @classmethod
    def _not_owned(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        # The spec's own field would silently lose, and checks would read a value of any type.
        owned = {"tensor_parallel_size": "tensor_parallel_size of this phase",
                 "pipeline_parallel_size": "pipeline_parallel_size of this phase",
                 "max_model_len": "model.max_model_len"}
        for key in owned.keys() & kwargs.keys():
            raise ValueError(f"engine_kwargs.{key} is set by the spec: use {owned[key]}")
        if not isinstance(kwargs.get("kv_transfer_config", {}), dict):
            raise ValueError("engine_kwargs.kv_transfer_config must be a mapping (merged over kv_transfer)")
        return kwargs

    @field_validator("env")
    @classmethod
    def _no_credentials(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if SECRET_NAME_PARTS & set(name.upper().split("_")):
                raise ValueError(f"{name} looks like a credential: release.yaml is committed and rendered into the "
                                 "RayService; put it in a Kubernetes Secret and reference it from the overlay's "
                                 "worker group env (valueFrom.secretKeyRef)")
        return env

    @model_validator(mode="after")
    def _one_scaling(self) -> Phase:
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError("set either replicas or autoscaling, not both")
        if self.replicas is None and self.autoscaling is None:
            self.replicas = 1
        return self

    @property
    def max_replicas(self) -> int:
        return self.autoscaling.max_replicas if self.autoscaling else int(self.replicas or 1)

    @property
    def devices(self) -> int:
        """GPUs (vLLM workers) one replica takes: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


INSTANCE_TYPE = r"^[a-z0-9][a-z0-9-]*\.[a-z0-9]+$"


class CostSettings(_Strict):
    """Overrides of the pinned price table (workflows/data/prices.yaml), e.g. a negotiated rate."""

    region: str | None = Field(None, max_length=32, pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    prices: dict[Annotated[str, Field(pattern=INSTANCE_TYPE, max_length=64)],
                 Annotated[float, Field(gt=0, le=10_000, allow_inf_nan=False)]] = Field({}, max_length=64)


class Metrics(_Strict):
    """Where validation reads the engines' histograms on a cluster. Unset: each worker pod's metrics
    port directly. `prometheus_url`: a Prometheus that scrapes them through the rendered PodMonitor
    (validation/prometheus.py), e.g. http://prometheus-operated.monitoring.svc:9090."""

    prometheus_url: str | None = Field(None, max_length=500, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")


# The drain's own bound: the stable Service's endpoints follow a selector change within seconds; a
# colour still reachable after this long is kept, never deleted (targets/kube/traffic.py drain).
DRAIN_ROUTE_S = 300
# What a step does besides waiting (process start, render, API calls, diagnosis) within its deadline,
# so the CLI always times out first and prints why before Argo kills the pod.
STEP_MARGIN_S = 300
# The validate step's loads are bounded by their own planned sizes, not by a cluster wait.
VALIDATION_LOADS_S = 5400


class Timeouts(_Strict):
    """How long the pipeline waits on the cluster, in seconds: the one place these live. The Argo
    workflow's deadlines are derived from them (workflows/argo/definitions.py) and `pdops check` refuses a
    workflow whose deadlines cannot contain them (workflows/checks/deadlines.py)."""

    rollout_s: PositiveInt = Field(1500, le=86_400)     # rollout: the candidate serves (KubeRay RUNNING)
    reference_s: PositiveInt = Field(1800, le=86_400)   # the single-engine reference RayService serves
    restore_s: PositiveInt = Field(3600, le=86_400)     # rollback/restore: the good release serves again
    drain_s: float = Field(30, ge=0, le=3_600, allow_inf_nan=False)  # grace after the Service moved

    def step_waits(self) -> dict[str, float]:
        """The longest each kind of step waits on the cluster (the CLI bounds its waits by these)."""
        drain = min(self.restore_s, DRAIN_ROUTE_S) + self.drain_s
        return {"render": 0.0, "rollout": float(self.rollout_s),
                "validate": float(self.reference_s + VALIDATION_LOADS_S),
                "promote": drain, "rollback": self.restore_s + drain}

    @classmethod
    def widest(cls, specs: list[Timeouts]) -> Timeouts:
        """Per field the longest of `specs` (the defaults when there are none): what one workflow
        serving every environment must contain."""
        if not specs:
            return cls()
        return cls(**{name: max(getattr(t, name) for t in specs) for name in cls.model_fields})


class ReleaseSpec(_Strict):
    """A release: which model, how prefill and decode are sized, how KV moves, which SLOs gate it."""

    name: str = Field(pattern=DNS_LABEL)
    model: Model
    accelerator: Accelerator = Accelerator()
    kv_transfer: KVTransfer = KVTransfer()
    prefill: Phase = Phase()
    decode: Phase = Phase()
    # NIXL handshake from every prefill replica at start-up, so the first request pays no setup.
    prewarm: bool = True
    slo: SLO = SLO()
    validation: Validation = Validation()
    cost: CostSettings = CostSettings()
    metrics: Metrics = Metrics()
    timeouts: Timeouts = Timeouts()


def parse_spec(data: Any, file: str | os.PathLike[str]) -> ReleaseSpec:
    if not isinstance(data, dict):
        raise InputError(file, "", f"expected a mapping at the top level, got {type(data).__name__}",
                         "start the file with `name:` and `model:` (see docs/release-spec.md)")
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        field = field_path(err["loc"])
        if err["type"] == "extra_forbidden":
            problem = "unknown field" + more
            fix = "remove it or fix its spelling (docs/release-spec.md lists every field)"
        elif err["type"] == "missing":
            problem, fix = "required field is missing" + more, "add it (docs/release-spec.md)"
        else:
            problem, fix = err["msg"] + more, "correct the value (docs/release-spec.md)"
        raise InputError(file, field, problem, fix) from None


def load_spec(overlay: Path) -> ReleaseSpec:
    path = Path(overlay) / SPEC_FILE
    spec = parse_spec(read_yaml_file(path), path)
    if spec.validation.scenarios or spec.validation.known_divergences:  # pdops diff's files: exist and parse
        spec_files(spec.validation, path)
    return spec


def repository_root(overlay: Path) -> Path:
    """The folder holding kustomize/ (beside overlays/): everything an overlay uses lies inside it."""
    overlay = overlay.resolve()
    return next((d for d in (overlay, *overlay.parents) if (d / "kustomize").is_dir()), overlay)


def repository_file(base: Path, relative: str, spec_file: str | Path, field: str, fix: str) -> Path:
    """A file a release.yaml names relative to `base` (its overlay): it must exist inside the
    repository (what the Argo step checked out is all a release may read). `fix` says where such
    files belong."""
    root = repository_root(Path(base))
    path = (Path(base) / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise InputError(spec_file, field, f"{relative!r} points outside the repository ({root})", fix)
    if not path.is_file():
        raise InputError(spec_file, field, f"{relative!r}: no such file (looked for {path})",
                         "commit the file, or fix the path (relative to the overlay)")
    return path


def spec_files(validation: Validation, release_file: str | Path) -> tuple[list[Path], Path | None]:
    """The release's `validation.scenarios` and `validation.known_divergences` as paths, each
    checked now (exists, inside the repository, parses) so a bad file blocks the release before
    anything is applied. Paths are relative to the release.yaml (as traces are); the repository
    is repository_root (the folder holding kustomize/); one helper (repository_file) checks them
    and traces alike."""
    release_file = Path(release_file)
    base = release_file.parent

    def resolve(rel: str, field: str) -> Path:
        return repository_file(base, rel, release_file, field,
                               "keep scenario and known-divergence files in the repository, next to the overlay")

    paths = [resolve(rel, f"validation.scenarios[{i}]") for i, rel in enumerate(validation.scenarios)]
    for p in paths:
        scenarios.load(p)
    known_path = None
    if validation.known_divergences:
        known_path = resolve(validation.known_divergences, "validation.known_divergences")
        known.load(known_path)
    return paths, known_path
