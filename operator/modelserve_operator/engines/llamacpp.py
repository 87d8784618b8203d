"""llama.cpp server, the cpu profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import HUB_CACHE_PATH, LOOPBACK, EngineFacts, engine_container

if TYPE_CHECKING:  # the spec imports the engines for their facts
    from ..spec import ModelServer

FACTS = EngineFacts(
    name="llamacpp",
    image="ghcr.io/ggml-org/llama.cpp:server-b9093",
    command=("/app/llama-server",),  # the image's own ENTRYPOINT
    port=8081,  # its old default, 8080, is the sidecar's
    health_path="/health",
    metrics_path="/metrics",
    shm_size="1Gi",
)


def args(ms: ModelServer) -> list[str]:
    spec = ms.spec
    source = ["-m", spec.model] if spec.model.startswith("/") else ["-hf", spec.model]
    out = [*source, "--alias", ms.name, "--host", LOOPBACK, "--port", str(FACTS.port)]
    if spec.max_model_len is not None:
        out += ["-c", str(spec.max_model_len)]
    out += ["--metrics", "--jinja"]  # --jinja: the chat template also renders tool calls
    return out


def env(ms: ModelServer) -> list[dict[str, Any]]:
    # `-hf` downloads into LLAMA_CACHE: keep it on the hub cache volume.
    return [{"name": "LLAMA_CACHE", "value": f"{HUB_CACHE_PATH}/llama.cpp"}]


def container(ms: ModelServer, image: str, drain_seconds: int, hub_endpoint: str = "") -> dict[str, Any]:
    return engine_container(ms, FACTS, args(ms), image, drain_seconds, env(ms), hub_endpoint=hub_endpoint)
