# kvserve: OpenAI-compatible server on llama.cpp, one process, one engine.
# Build stage compiles llama-cpp-python (about 5 minutes on 2 cores); the runtime stage
# carries only the virtualenv.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY engine ./engine
COPY cache ./cache
COPY chat ./chat
RUN python -m venv /opt/kvserve \
 && /opt/kvserve/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/kvserve/bin/pip install --no-cache-dir .

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 kvserve
COPY --from=build /opt/kvserve /opt/kvserve
ENV PATH=/opt/kvserve/bin:$PATH \
    KVSERVE_SERVER_HOST=0.0.0.0 \
    KVSERVE_SERVER_PORT=8080
USER kvserve
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/health || exit 1
# Exactly one server process: the engine lives in it. Scale with replicas.
# Configuration: mount a TOML file and pass --config, or set KVSERVE_* variables.
ENTRYPOINT ["kvserve"]
