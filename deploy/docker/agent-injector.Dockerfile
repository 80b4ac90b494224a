# syntax=docker/dockerfile:1
# The agent injector: an image holding only the agent bundle (a relocatable Python interpreter,
# its shared libraries, a pruned stdlib and the agent) at /.orchard/bundle.
#
#   docker build -f deploy/docker/agent-injector.Dockerfile -t orchard-agent-injector:0.1.0 .
#
# The Kubernetes backend runs it as the init container of every sandbox pod:
# /.orchard/bundle/bin/python3 -I -S -c "..." copies the bundle into an emptyDir that the
# sandbox container mounts, so the agent runs in any image, even one without Python or libc.
# No shell is needed here, hence FROM scratch.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE} AS build

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /src/
COPY orchard /src/orchard
# The bundle is built from this stage's interpreter (ldd and patchelf collect its libraries) and
# patched to load from /.orchard/bundle: it must be copied to exactly that path below.
RUN pip install --no-cache-dir "/src[server]" && orchard agent-bundle /out/bundle

FROM scratch
COPY --from=build /out/bundle /.orchard/bundle
