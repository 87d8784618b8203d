# One image for the modelserve operator, the per-pod sidecar, the gateway, the `modelserve` CLI and the
# node cache (its agent, `modelserve-nodecache`, and each model pod's fetch, `modelserve-fetch`).
# Kubernetes probes check health (the operator's /healthz, the sidecar's /healthz and
# /readyz), so the image has no HEALTHCHECK. Build: docker build -t modelserve:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the wheel and a virtual environment holding it and its runtime dependencies ---
FROM ${PYTHON_IMAGE} AS build
# PIP_NO_CACHE_DIR keeps the layer small; tests/packaging runs these RUN lines with a cache.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VENV=/opt/modelserve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY modelserve/ modelserve/
RUN python -m venv "$VENV" \
    && "$VENV/bin/pip" wheel --no-deps --wheel-dir dist . \
    && "$VENV/bin/pip" install dist/modelserve-*.whl

# --- runtime: the interpreter, the virtual environment, a non-root user; no compilers, no pip cache ---
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="modelserve" \
      org.opencontainers.image.description="Kubernetes operator that serves LLMs (vLLM, SGLang, llama.cpp) behind an authenticating, metering sidecar" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}"
# A numeric UID (the operator gives its sidecars the same one) so the kubelet can verify
# runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 65532 modelserve \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin modelserve
COPY --from=build /opt/modelserve /opt/modelserve
# Bytecode was compiled at install time; the root filesystem is read-only in the chart.
ENV PATH=/opt/modelserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# The chart and the operator set `command` per container (modelserve-operator, modelserve-sidecar);
# this default serves `docker run IMAGE` and `docker run IMAGE modelserve render ...` alike.
CMD ["modelserve-operator"]
