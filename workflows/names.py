"""Names shared across the pipeline: namespaces, service accounts, labels, annotations.

The bottom layer: it imports nothing of ours, so the Argo definitions (workflows/argo/definitions.py), the
Argo Events objects (events.py), the RBAC (rbac.py) and the targets can all import it without a
cycle, and no name is written twice.
"""
from __future__ import annotations

# Argo side: where the pipeline's workflows run and who they run as.
WORKFLOW_NAMESPACE = "pdops"
SERVICE_ACCOUNT = "pd-release"                 # runs every pd-release / pd-canary step
EXECUTOR_ROLE = "pd-release-executor"          # what Argo's executor needs to report outputs
SENSOR_SERVICE_ACCOUNT = "pd-release-sensor"   # the Argo Events Sensor submitting pd-release
RELEASE_TEMPLATE = "pd-release"                # WorkflowTemplate
CANARY_WORKFLOW = "pd-canary"                  # CronWorkflow

# Environments: overlays/<env>, served in namespace llm-<env>.
ENVIRONMENTS = ("dev", "staging", "prod")
ENV_NAMESPACES = {env: f"llm-{env}" for env in ENVIRONMENTS}

# Labels and annotations pdops puts on what it applies (KubeRay copies pod-template labels to pods).
PART_OF = {"app.kubernetes.io/part-of": "pdops"}
COLOUR_LABEL = "pdops.dev/colour"
RELEASE_LABEL = "pdops.dev/release"
HISTORY_LABEL = "pdops.dev/history-of"
PHASE_LABEL = "pdops.dev/phase"                # worker pod templates and node groups: prefill / decode
ROLE_LABEL = "pdops.dev/role"                  # "reference": the short-lived single-engine RayService and its pods
DIGEST_ANNOTATION = "pdops.dev/digest"
REVISION_ANNOTATION = "pdops.dev/revision"
FIELD_MANAGER = "pdops"                        # server-side apply field manager
LOCK_NAME = "pdops-release"                    # the Lease that keeps two releases of one namespace apart
RUN_ENV = "PDOPS_RUN_ID"                         # an Argo run's id (workflow name): its steps hold the run's Lease
RUN_LEASE_S = 600      # a run's Lease outlives the gaps between its steps (pod start, retry backoff <= 120 s)
RUN_LEASE_ENV = "PDOPS_RUN_LEASE_S"   # unset in the step image and the committed workflows


def run_lease_s() -> float:
    """A run's Lease duration (its steps renew it every quarter of it; a dead run's is taken over once
    unchanged for it): RUN_LEASE_S, or $PDOPS_RUN_LEASE_S where a test scales time (the Argo tier's
    tests/argo/test_run_lock.py runs the committed pd-release with 30 s)."""
    import os

    raw = os.environ.get(RUN_LEASE_ENV, "").strip()
    return float(raw) if raw else float(RUN_LEASE_S)

# Validation's API key comes from this Secret (optional) into this variable, never a parameter.
API_KEY_ENV = "PDOPS_API_KEY"
API_KEY_SECRET = {"name": "pdops-validation-api-key", "key": "api-key"}
