# syntax=docker/dockerfile:1
# The orchestrator: `orchard serve` with the Kubernetes backend.
#
#   docker build -f deploy/docker/orchestrator.Dockerfile -t orchard-orchestrator:0.1.0 .
#
# The build context is the repository root; orchestrator.Dockerfile.dockerignore (next to this
# file, honoured by BuildKit) keeps everything but the package sources out of it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini is PID 1: it forwards SIGTERM to the server (uvicorn then drains for up to 10 s) and
# reaps any stray child.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# A fixed numeric uid, so the Deployment's runAsUser and runAsNonRoot can check it.
RUN groupadd --system --gid 10001 orchard \
    && useradd --system --uid 10001 --gid orchard --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin orchard

COPY pyproject.toml README.md /src/
COPY orchard /src/orchard
# The server extra only: no torch, no tokenizers, no grading in the orchestrator image.
RUN pip install --no-cache-dir "/src[server]" && rm -rf /src

USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["/usr/bin/tini", "--", "orchard"]
CMD ["serve", "--config", "/etc/orchard/orchard.yaml", "--host", "0.0.0.0", "--port", "8000"]
