"""llama.cpp server, the cpu profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import CHAT_TEMPLATE_PATH, HUB_CACHE_PATH, LOOPBACK, Engine

if TYPE_CHECKING:  # the spec imports the engines for their facts
    from modelserve.api.spec import ModelServer

BUILD = 9093  # llama.cpp's build number: the image tag, and what hack/ builds from source


class LlamaCpp(Engine):
    def args(self, ms: ModelServer) -> list[str]:
        spec = ms.spec
        source = ["-m", spec.model] if spec.model.startswith("/") else ["-hf", spec.model]
        out = [*source, "--alias", ms.name, "--host", LOOPBACK, "--port", str(self.port)]
        if spec.max_model_len is not None:
            out += ["-c", str(spec.max_model_len)]
        out += ["--metrics", "--jinja"]  # --jinja: the chat template also renders tool calls
        if spec.chat_template is not None:
            # After --jinja: before it, llama-server takes only the templates it has built in.
            out += ["--chat-template-file", CHAT_TEMPLATE_PATH]
        return out

    def env(self, ms: ModelServer) -> list[dict[str, Any]]:
        # `-hf` downloads into LLAMA_CACHE: keep it on the hub cache volume.
        return [{"name": "LLAMA_CACHE", "value": f"{HUB_CACHE_PATH}/llama.cpp"}]


ENGINE = LlamaCpp(
    name="llamacpp",
    title="llama.cpp",
    version=f"b{BUILD}",
    image=f"ghcr.io/ggml-org/llama.cpp:server-b{BUILD}",
    command=("/app/llama-server",),  # the image's own ENTRYPOINT
    port=8081,  # its old default, 8080, is the sidecar's
    health_path="/health",
    metrics_path="/metrics",
    metric_prefix="llamacpp:",
    shm_size="1Gi",
    # No --tool-call-parser: llama.cpp parses tool calls from the model's chat template (--jinja).
    # llama-server names the served model with -a/--alias and takes its key from a file too.
    owned_flags=("--host", "--port", "--api-key", "--api-key-file", "--alias", "-a"),
    # b9093's OpenAI-compatible routes read `repeat_penalty` and ignore `repetition_penalty`.
    sampling_aliases=(("repetition_penalty", "repeat_penalty"),),
)
