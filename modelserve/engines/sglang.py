"""SGLang, the low-latency profile."""

from __future__ import annotations

from typing import Any

from modelserve.contracts import engine_routes
from modelserve.contracts.adapters import AdapterApi
from modelserve.contracts.choices import Dtype

from . import view
from .base import (
    CHAT_TEMPLATE_PATH,
    GROUP_SIZE,
    LEADER_ADDRESS,
    LOOPBACK,
    NONROOT_UID,
    WORKER_INDEX,
    Engine,
    Role,
    Switch,
)
from .view import ServedModel

VERSION = "0.5.23"
# Where the group's torch.distributed rendezvous listens on the leader (--dist-init-addr): its
# TCPStore, which the other ranks wait for (see launch).
DIST_INIT_PORT = 20000


class SGLang(Engine):
    def args(self, ms: ServedModel) -> list[str]:
        spec = ms.spec
        out = ["--model-path", spec.model, "--served-model-name", ms.name, "--host", LOOPBACK, "--port", str(self.port)]
        tensor, pipeline = self.split(spec)
        out += ["--tp-size", str(tensor)]
        if pipeline > 1:
            out += ["--pp-size", str(pipeline)]
        out += ["--dtype", spec.dtype.value]
        if spec.max_model_len is not None:
            out += ["--context-length", str(spec.max_model_len)]
        if spec.gpu_memory_utilization is not None:
            out += ["--mem-fraction-static", str(spec.gpu_memory_utilization)]
        if spec.tool_call_parser:
            out += ["--tool-call-parser", spec.tool_call_parser]
        if spec.chat_template is not None:
            out += ["--chat-template", CHAT_TEMPLATE_PATH]
        if spec.load_format:
            out += ["--load-format", spec.load_format]
        if spec.torch_compile:
            out.append("--enable-torch-compile")
        if spec.chunked_prefill_size is not None:
            out += ["--chunked-prefill-size", str(spec.chunked_prefill_size)]
        if spec.vision:
            # SGLang 0.5.23 turns image input off for some vision architectures (Gemma3, Llama4,
            # Step3-VL) unless told (srt/configs/model_config.py); the flag does nothing to others.
            out.append("--enable-multimodal")
        if spec.adapters is not None:
            # No adapters at start (the sidecar loads them through /load_lora_adapter), so SGLang
            # needs the rank and target modules up front (check_lora_server_args); its batch count
            # includes the base model's requests, hence one more.
            limits = view.adapter_limits(spec)
            out += ["--enable-lora", "--max-lora-rank", str(limits.max_rank), "--lora-target-modules", "all"]
            out += ["--max-loras-per-batch", str(limits.max_per_batch + 1)]
        out.append("--enable-metrics")
        return out

    def launch(self, ms: ServedModel, role: Role) -> tuple[list[str], list[str]]:
        """Every pod of a group runs the same server, told the group's size, its own rank and the
        leader's rendezvous address by LeaderWorkerSet's variables; only rank 0 serves HTTP.

        No wait before it, unlike vLLM's Ray group: the pods may start in any order because every rank
        meets the others in torch.distributed's TCPStore on --dist-init-addr (srt/distributed/bootstrap.py
        at 0.5.23, ModelRunner's init_torch_distributed before), whose client retries both a name that
        does not resolve yet and a refused connection until the process group's timeout (--dist-timeout,
        unset: torch's NCCL default, 10 min; torch/csrc/distributed/c10d/socket.cpp). Nothing before it
        resolves the address (SGLang 0.5.10's and 0.5.23's srt/, without dp-attention)."""
        if role == Role.SINGLE:
            return super().launch(ms, role)
        group = ["--nnodes", GROUP_SIZE, "--node-rank", WORKER_INDEX]
        group += ["--dist-init-addr", f"{LEADER_ADDRESS}:{DIST_INIT_PORT}"]
        return list(self.command), [*self.args(ms), *group, *ms.spec.engine_args]

    def env(self, ms: ServedModel) -> list[dict[str, Any]]:
        # SGLang's /health (0.5.10 to 0.5.23) otherwise generates a token per call and polls for it in 1 s
        # sleeps (>= 1 s, up to 20 s under a long prefill), and on giving up marks the server unhealthy,
        # which makes SIGTERM skip the drain. Without it /health answers from the server's status: 503 until
        # SGLang's own warm-up request succeeded and while shutting down, else 200 (http_server.py).
        out = [{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "false"}]
        # No /docs, /redoc, /openapi.json describing every route (entrypoints/http_server.py).
        out.append({"name": "DISABLE_OPENAPI_DOC", "value": "true"})
        # Hybrid models such as LFM2 keep a convolution state, bfloat16 unless told otherwise.
        if ms.spec.dtype == Dtype.FLOAT16:
            out.append({"name": "SGLANG_MAMBA_CONV_DTYPE", "value": "float16"})
        return out


# The names `--tool-call-parser` takes in SGLang 0.5.23: the keys of
# `FunctionCallParser.ToolCallParserEnum` (python/sglang/srt/function_call/function_call_parser.py),
# which server_args.py makes the flag's argparse choices (with `auto`, which reads the parser from the
# chat template or checkpoint); checked against the sglang-0.5.23 wheel by
# tests/engines/test_engine_source.py. Any other name stops the server at start with `invalid choice`.
TOOL_CALL_PARSERS = tuple(
    """
    apertus2509 beam cohere_command4 deepseekv3 deepseekv31 deepseekv32 deepseekv4 deepseekv41 dots gemma4
    gigachat3 gigachat35 glm glm45 glm47 gpt-oss hermes hunyuan inkling interns1 iquest_q1 k2_horizon kimi_k2
    kimi_k3 lfm2 ling3 llama3 mimo minicpm5 minimax-m2 minimax-m3 mistral muse nanbeige poolside_v1 pythonic
    qwen qwen25 qwen3_coder response_template spark25 step3 step3p5 trinity
    """.split()
)

# The faster loaders spec.loadFormat offers as `--load-format`, as vLLM's (vllm.py): both are among
# the flag's argparse choices in SGLang 0.5.23 (`LOAD_FORMAT_CHOICES`, python/sglang/srt/arg_groups/
# choices.py), checked by tests/engines/test_engine_source.py; any other name stops the server at start
# with `invalid choice`.
LOAD_FORMATS = ("runai_streamer", "fastsafetensors")

# What opens SGLang 0.5.23's administration routes beyond those open by default (which only the
# sidecar's allowlist closes), checked against the sglang-0.5.23 wheel (python/sglang/srt/) by
# tests/engines/test_engine_source.py, which derives every flag and variable in the conditions around
# a route's registration.
ADMIN_FLAGS = (
    Switch(
        "--enable-lora",
        "/load_lora_adapter, /unload_lora_adapter and /load_lora_adapter_from_tensors, which unpickles its body; "
        "spec.adapters serves LoRA adapters, loaded by the sidecar",
    ),
    Switch("--lora-paths", "turns on --enable-lora and its routes"),
    Switch("--enable-custom-logit-processor", "runs the serialized logit processor a request's body carries"),
    Switch("--enable-return-hidden-states", "hands the model's hidden states to every caller"),
    Switch(
        "--admin-api-key",
        "/server_info shows it to whoever reaches the engine; the sidecar checks the keys and the allowlist "
        "closes the admin routes",
    ),
)
# SGLang 0.5.23 reads where its Ollama and Vertex routes go from variables: any path, a consumer
# route's included, would then be served by another API's handler.
MOVED_ROUTE = "puts an Ollama or Vertex route at any path, over a consumer route's"
ADMIN_ENV = (
    Switch("DUMPER_SERVER_PORT", "/dumper/{method}, the debug tensor dumper"),
    Switch("SGLANG_OLLAMA_ROOT_ROUTE", MOVED_ROUTE),
    Switch("SGLANG_OLLAMA_CHAT_ROUTE", MOVED_ROUTE),
    Switch("SGLANG_OLLAMA_GENERATE_ROUTE", MOVED_ROUTE),
    Switch("SGLANG_OLLAMA_TAGS_ROUTE", MOVED_ROUTE),
    Switch("SGLANG_OLLAMA_SHOW_ROUTE", MOVED_ROUTE),
    Switch("AIP_PREDICT_ROUTE", MOVED_ROUTE),
    # Not derivable: it swaps the Python HTTP server (whose routes are read) for a compiled one.
    Switch("SGLANG_RUST_SERVER", "a compiled HTTP server in place of the Python one, its routes unread"),
)
# Flags and variables in the conditions around a route's registration that open nothing a key holder
# could reach or use against others: engineArgs and env may set them (the derived-facts test holds
# every such name to ADMIN_FLAGS, ADMIN_ENV or this table).
QUIET_SWITCHES = (
    Switch("--enable-metrics", "/metrics, which the sidecar reads (the operator passes it)"),
    Switch("DISABLE_OPENAPI_DOC", "turns /openapi.json off (the operator sets it)"),
)
# Flags 0.5.10 had that 0.5.23 lacks (derived from both releases' parsers); SGLang exits at start on
# them (`unrecognized arguments`, or `ambiguous option` for the two split by phase).
REMOVED_FLAGS = (
    Switch("--cuda-graph-bs", "now --cuda-graph-bs-decode and --cuda-graph-bs-prefill"),
    Switch("--cuda-graph-max-bs", "now --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill"),
    *(
        Switch(name, "")
        for name in """
        --collect-tokens-histogram --debug-tensor-dump-inject --disable-piecewise-cuda-graph
        --ds-channel-config-path --ds-heavy-channel-num --ds-heavy-channel-type --ds-heavy-token-num
        --ds-sparse-decode-threshold --enable-double-sparsity --enable-expert-distribution-metrics
        --enable-nan-detection --enable-nsa-prefill-context-parallel --enable-piecewise-cuda-graph
        --enable-prefill-context-parallel --enforce-piecewise-cuda-graph --hybrid-kvcache-ratio
        --keep-mm-feature-on-device --mamba-scheduler-strategy --multi-item-scoring-delimiter
        --nsa-decode-backend --nsa-prefill-backend --nsa-prefill-cp-mode --piecewise-cuda-graph-compiler
        --piecewise-cuda-graph-max-tokens --piecewise-cuda-graph-tokens --prefill-cp-mode
        --prefill-round-robin-balance --stream-output --torchao-config
        """.split()
    ),
)
# Registrations whose path is computed at run time, by their expression.
COMPUTED_PATHS = (
    ("_ollama_root_route", "SGLANG_OLLAMA_ROOT_ROUTE: the Ollama root route, / unless set"),
    ("os.environ.get('SGLANG_OLLAMA_CHAT_ROUTE', '/api/chat')", "SGLANG_OLLAMA_CHAT_ROUTE"),
    ("os.environ.get('SGLANG_OLLAMA_GENERATE_ROUTE', '/api/generate')", "SGLANG_OLLAMA_GENERATE_ROUTE"),
    ("os.environ.get('SGLANG_OLLAMA_TAGS_ROUTE', '/api/tags')", "SGLANG_OLLAMA_TAGS_ROUTE"),
    ("os.environ.get('SGLANG_OLLAMA_SHOW_ROUTE', '/api/show')", "SGLANG_OLLAMA_SHOW_ROUTE"),
    ("os.environ.get('AIP_PREDICT_ROUTE', '/vertex_generate')", "AIP_PREDICT_ROUTE"),
)
# Files that register routes on servers other than `sglang.launch_server`'s HTTP server.
OTHER_SERVERS = (
    ("sglang/multimodal_gen/", "the diffusion (image and video) server, `sglang generate`"),
    ("sglang/srt/disaggregation/encoder/", "the encoder's server in encoder-disaggregated serving"),
    ("sglang/srt/distributed/gated_launch.py", "the gated launch's control server (--gated-launch-port)"),
    ("sglang/srt/entrypoints/engine_info_bootstrap_server.py", "the transfer engine's bootstrap server"),
    ("sglang/srt/utils/common.py", "launch_dummy_health_check_server, for ranks that serve no HTTP"),
)

ENGINE = SGLang(
    name="sglang",
    title="SGLang",
    profile="low-latency",
    summary="SGLang on GPUs",
    version=VERSION,
    image=f"lmsysorg/sglang:v{VERSION}",
    command=("python3", "-m", "sglang.launch_server"),  # the image has no server ENTRYPOINT
    port=30000,
    health_path="/health",
    metrics_path="/metrics",
    metric_prefix="sglang:",
    shm_size="32Gi",  # what the upstream container form uses
    on_gpus=True,
    routes=engine_routes.SGLANG,
    # Above SGLANG_HEALTH_CHECK_TIMEOUT (20 s): should /health generate again (env() turns that
    # off; spec.env may turn it back on), SGLang's own verdict comes before the sidecar gives up.
    probe_timeout_seconds=25.0,
    tool_call_parsers=TOOL_CALL_PARSERS,
    load_formats=LOAD_FORMATS,
    abbreviated_flags=True,  # argparse takes unambiguous prefixes of long flags
    spans_nodes=True,  # every pod of a group runs the server, told its rank (launch)
    # SGLang 0.5.23's spellings (srt/arg_groups/fields/parallel.py), --nccl-init-addr the old name of
    # --dist-init-addr.
    group_flags=(
        "--tensor-parallel-size",
        "--tp-size",
        "--pipeline-parallel-size",
        "--pp-size",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--nccl-init-addr",
    ),
    admin_flags=ADMIN_FLAGS,
    admin_env=ADMIN_ENV,
    removed_flags=REMOVED_FLAGS,
    previous_version="0.5.10",
    unknown_flag_error="error: unrecognized arguments: FLAG",
    adapter_api=AdapterApi.SGLANG,
    # --max-running-requests unset, SGLang 0.5.23 runs as many as its KV cache holds, between 2048 and
    # 4096 per data parallel worker (resolve_max_num_reqs, srt/mem_cache/kv_cache_configurator.py; 48
    # with speculative decoding, srt/arg_groups/speculative_hook.py), as 0.5.10 did: the largest, so
    # the sidecar never throttles it.
    batch_flags=("--max-running-requests",),
    default_batch=4096,
    # Low-latency: fewer requests per replica before the autoscaler adds one, so each streams faster.
    default_target=32,
    own_fields=("torchCompile", "chunkedPrefillSize"),  # --enable-torch-compile, --chunked-prefill-size
    # Non-root, HOME, ~/.cache (FlashInfer's and Triton's kernels, torch's compile cache) and /tmp on
    # volumes; the root filesystem writable for the NVIDIA toolkit's hooks only (base.py).
    run_as_user=NONROOT_UID,
    read_only_root=False,
    user_caches=True,
)
