"""Profile external: no engine in the pod; the sidecar fronts an OpenAI-compatible server outside
the cluster (an MLX server on a Mac, an Ollama host), named by spec.external.url.

The facts the operator needs in place of an engine module's.
"""

from __future__ import annotations

PROFILE = "external"  # the spec's `profile` value, after the engines' (engines/__init__.py)
COMPONENT = "external"  # the pods' app.kubernetes.io/component label
# Ollama and MLX servers have no /health; /v1/models answers once the server is up (and the
# sidecar then looks for spec.model in it), so it serves as both health and readiness check.
HEALTH_PATH = "/v1/models"
PROBE_TIMEOUT_SECONDS = 5.0
# Nothing runs after the sidecar in the pod: its grace period is the sidecar's drain plus this.
SHUTDOWN_SECONDS = 5
