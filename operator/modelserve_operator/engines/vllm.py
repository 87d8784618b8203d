"""vLLM, the high-throughput profile."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .base import LOOPBACK, EngineFacts, engine_container

if TYPE_CHECKING:  # the spec imports the engines for their facts
    from ..spec import ModelServer

FACTS = EngineFacts(
    name="vllm",
    image="vllm/vllm-openai:v0.32.0",
    command=("vllm", "serve"),  # the image's own ENTRYPOINT; the model comes first in the arguments
    port=8000,
    health_path="/health",
    metrics_path="/metrics",
    shm_size="16Gi",
)
# One image per prompt keeps vLLM's start-up profiling inside short contexts such as 1024 tokens.
IMAGES_PER_PROMPT = 1


def args(ms: ModelServer) -> list[str]:
    spec = ms.spec
    out = [spec.model, "--served-model-name", ms.name, "--host", LOOPBACK, "--port", str(FACTS.port)]
    out += ["--dtype", spec.dtype.value]
    if spec.max_model_len is not None:
        out += ["--max-model-len", str(spec.max_model_len)]
    if spec.gpu_memory_utilization is not None:
        out += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
    out += ["--tensor-parallel-size", str(spec.gpu_count)]
    if spec.tool_call_parser:
        out += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
    if spec.vision:
        out += ["--limit-mm-per-prompt", json.dumps({"image": IMAGES_PER_PROMPT}, separators=(",", ":"))]
    return out


def container(ms: ModelServer, image: str, drain_seconds: int) -> dict[str, Any]:
    return engine_container(ms, FACTS, args(ms), image, drain_seconds)
