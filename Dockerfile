# kvserve: an OpenAI-compatible server on llama.cpp; one process, one in-process engine.
#
#   docker build -t kvserve .
#   docker run -p 8080:8080 -v kvserve-cache:/var/cache/kvserve kvserve
#
# Stage 1 compiles llama-cpp-python (about 5 minutes on 2 cores) and builds wheels of
# kvserve, its `tracing` extra (OpenTelemetry: off until [tracing] otlp_endpoint is set)
# and every dependency; stage 2 installs those wheels offline and carries no
# compiler. Scale by running more containers (replicas), never more workers per container
# (deploy/docker-compose.yml: two replicas, nginx, Redis as the shared cache tier).
# Needs BuildKit (the default builder since Docker 23): pip's cache is a cache mount, so a
# rebuild does not compile llama-cpp-python again. Wheels found in .wheels/ of the build
# context (ignored by git) are used before anything is compiled; the Docker test hands
# over the one built on its host that way (tests/e2e/test_docker.py).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*
# Portable CPU code (no -march=native): the image may run on another CPU than the builder.
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF" \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY engine ./engine
COPY cache ./cache
COPY chat ./chat
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/context \
    pip wheel --wheel-dir /wheels --find-links /context/.wheels '.[tracing]'

FROM ${PYTHON_IMAGE} AS runtime
# libgomp1: llama.cpp's OpenMP threads. No compilers, no curl: the health check is Python.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 kvserve \
 && useradd --system --uid 10001 --gid kvserve --home-dir /home/kvserve --create-home kvserve \
 && mkdir -p /var/cache/kvserve /etc/kvserve \
 && chown kvserve:kvserve /var/cache/kvserve
# The builder's wheels are mounted for this one step, not copied: a COPY is a layer of its
# own that stays in the image even after the next step deletes the files (and with the
# vfs driver of the Docker test every layer is a full copy of the filesystem below it).
RUN --mount=type=bind,from=builder,source=/wheels,target=/tmp/wheels \
    python -m venv /opt/kvserve \
 && /opt/kvserve/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels 'kvserve[tracing]'
# Configuration: mount a TOML file (-v ./kvserve.toml:/etc/kvserve/kvserve.toml:ro and
# add `--config /etc/kvserve/kvserve.toml`) or set KVSERVE_<SECTION>_<KEY> variables.
ENV PATH=/opt/kvserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    KVSERVE_SERVER_HOST=0.0.0.0 \
    KVSERVE_SERVER_PORT=8080 \
    KVSERVE_CACHE_DISK_DIR=/var/cache/kvserve \
    HF_HUB_CACHE=/var/cache/kvserve/hub
# The KV cache's disk tier lives here, so a restarted container starts warm; and the hub
# cache (pulled models), so replicas that mount one volume serve the same models.
VOLUME ["/var/cache/kvserve"]
USER kvserve:kvserve
WORKDIR /home/kvserve
EXPOSE 8080
# /health is 503 while the model loads and 200 once it serves; asked on the port the
# server listens on (KVSERVE_SERVER_PORT may move it, e.g. with host networking).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('KVSERVE_SERVER_PORT', '8080'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=4).status != 200)"]
# `kvserve` runs exactly one uvicorn worker: the engine and its KV cache live in that
# process, so a second worker would load a second model and split the cache.
ENTRYPOINT ["kvserve"]
