"""vLLM, the high-throughput profile."""

from __future__ import annotations

import json
from typing import Any

from modelserve.contracts import engine_routes
from modelserve.contracts.adapters import AdapterApi

from . import view
from .base import CHAT_TEMPLATE_PATH, LOOPBACK, NONROOT_UID, Engine, Role, Switch, positive_int
from .ray_group import LEADER_SCRIPT, WORKER_SCRIPT
from .view import ServedModel, SpecView

VERSION = "0.33.0"
# vLLM 0.33.0's spellings of the flags that multiply its batch (engine/arg_utils.py).
PERFORMANCE_MODE_FLAGS = ("--performance-mode",)
DATA_PARALLEL_FLAGS = ("--data-parallel-size", "-dp")
# One image per prompt keeps vLLM's start-up profiling inside short contexts such as 1024 tokens.
IMAGES_PER_PROMPT = 1


class VLLM(Engine):
    def args(self, ms: ServedModel) -> list[str]:
        spec = ms.spec
        out = [spec.model, "--served-model-name", ms.name, "--host", LOOPBACK, "--port", str(self.port)]
        # /docs, /redoc and /openapi.json would describe every route, admin ones included.
        out += ["--dtype", spec.dtype.value, "--disable-fastapi-docs"]
        if spec.max_model_len is not None:
            out += ["--max-model-len", str(spec.max_model_len)]
        if spec.gpu_memory_utilization is not None:
            out += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        if view.multi_node(spec):
            tensor, pipeline = self.split(spec)
            out += ["--tensor-parallel-size", str(tensor), "--pipeline-parallel-size", str(pipeline)]
            out += ["--distributed-executor-backend", "ray"]
        else:
            out += ["--tensor-parallel-size", str(self.gpu_count(spec))]
        if spec.tool_call_parser:
            out += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
        if spec.chat_template is not None:
            out += ["--chat-template", CHAT_TEMPLATE_PATH]
        if spec.load_format:
            out += ["--load-format", spec.load_format]
        if spec.adapters is not None:
            # The sidecar loads the adapters through /v1/load_lora_adapter (env below); these size
            # the engine's adapter slots once, at start.
            limits = view.adapter_limits(spec)
            out += ["--enable-lora", "--max-loras", str(limits.max_per_batch), "--max-lora-rank", str(limits.max_rank)]
        if spec.vision:
            # No switch to turn images on: vLLM 0.33.0 takes them for every architecture that supports
            # them (config/model.py), only --language-model-only turns them off. This caps them.
            out += ["--limit-mm-per-prompt", json.dumps({"image": IMAGES_PER_PROMPT}, separators=(",", ":"))]
        return out

    def batch_size(self, spec: SpecView) -> int:
        """As Engine's, and as vLLM 0.33.0 sizes it (as 0.32.0 did): `--performance-mode throughput` doubles the
        default (not a given --max-num-seqs), and each data parallel rank batches that many."""
        args = spec.engine_args
        seqs = positive_int(self.flag_value(args, self.batch_flags))
        if seqs is None:
            throughput = self.flag_value(args, PERFORMANCE_MODE_FLAGS) == "throughput"
            seqs = self.default_batch * (2 if throughput else 1)
        return seqs * (positive_int(self.flag_value(args, DATA_PARALLEL_FLAGS)) or 1)

    def env(self, ms: ServedModel) -> list[dict[str, Any]]:
        # Registers /v1/load_lora_adapter and /v1/unload_lora_adapter (serve/lora/api_router.py): on
        # 127.0.0.1 only, called by the sidecar, refused to every client by its allowlist.
        if ms.spec.adapters is None:
            return []
        return [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]

    def launch(self, ms: ServedModel, role: Role) -> tuple[list[str], list[str]]:
        # Across nodes vLLM runs on a Ray cluster of the group's pods: the head on the leader, the workers
        # joining it, each side waiting for the other, bounded (ray_group.py), so the pods may start in
        # any order. vLLM's Ray executor would wait for the group's GPUs too (its placement group, up to
        # 30 min), but only once vLLM runs, and without saying which pod is missing. `sh -c SCRIPT NAME
        # ARGS...`: vLLM replaces the leader's shell with the ordinary `vllm serve` arguments ("$@"),
        # which stay a list the parser tests read.
        if role == Role.LEADER:
            return ["/bin/sh", "-c", LEADER_SCRIPT, "vllm-leader"], [*self.args(ms), *ms.spec.engine_args]
        if role == Role.WORKER:
            return ["/bin/sh", "-c", WORKER_SCRIPT, "vllm-worker"], []
        return super().launch(ms, role)


# The names `--tool-call-parser` takes in vLLM 0.33.0: the keys of `_TOOL_PARSERS_TO_REGISTER` in
# vllm/tool_parsers/__init__.py, checked against the vllm-0.33.0 wheel by
# tests/engines/test_engine_source.py. At start the launcher (`validate_api_server_args`) exits with
# `KeyError: invalid tool call parser` on any other name, unless a `--tool-parser-plugin` registered it.
TOOL_CALL_PARSERS = tuple(
    """
    apertus beam cohere_command3 cohere_command4 deepseek_v3 deepseek_v31 deepseek_v32 deepseek_v4 deepseek_v41
    dots ernie45 functiongemma gemma4 gigachat3 glm45 glm47 granite granite-20b-fc granite4 hermes hf
    hunyuan_a13b hy_v3 hy_v4 inkling internlm jamba k2_horizon kimi_k2 kimi_k3 lfm2 ling3 llama3_json
    llama4_json llama4_pythonic longcat mimo minicpm5 minimax_m2 minimax_m3 mistral muse muse_glimmer
    musespark1x olmo3 openai phi4_mini_json plamo3 poolside_v1 pythonic qwen3_coder qwen3_json qwen3_xml
    seed_oss step3 step3p5 step5 xlam
    """.split()
)

# The faster loaders spec.loadFormat offers as `--load-format`: runai_streamer streams safetensors
# with concurrent reads, fastsafetensors (its package in the image) reads them straight to the GPU.
# vLLM 0.33.0's parser takes any string (a plugin may register a loader); at start get_model_loader
# refuses a name missing from `_LOAD_FORMAT_TO_MODEL_LOADER` (vllm/model_executor/model_loader/
# __init__.py, keyed by its `LoadFormats`), checked by tests/engines/test_engine_source.py.
LOAD_FORMATS = ("runai_streamer", "fastsafetensors")

# What opens vLLM 0.33.0's administration routes, checked against the vllm-0.33.0 wheel (paths
# relative to vllm/entrypoints/) by tests/engines/test_engine_source.py, which derives every flag and
# variable in the conditions around a route's registration.
ADMIN_FLAGS = (
    Switch(
        "--enable-lora",
        "LoRA adapters, loadable at run time by any caller of /v1/load_lora_adapter with "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING; spec.adapters serves LoRA adapters, loaded by the sidecar",
    ),
    Switch("--profiler-config", "/start_profile and /stop_profile: a profiler slowing every request, traces on disk"),
    Switch(
        "--enable-scale-out", "/inference/v1/generate and /inference/v1/abort_requests, which aborts others' requests"
    ),
    Switch("--tokens-only", "/inference/v1/generate and /inference/v1/abort_requests, which aborts others' requests"),
    Switch("--enable-fault-tolerance", "/fault_tolerance/apply"),
)
ADMIN_ENV = (
    Switch(
        "VLLM_SERVER_DEV_MODE",
        "/collective_rpc (any worker method), /sleep, /pause, /abort_requests, live weight updates, /server_info",
    ),
    Switch("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "/v1/load_lora_adapter and /v1/unload_lora_adapter for every caller"),
    Switch("VLLM_ENABLE_RESPONSES_API_STORE", "every response kept in memory, readable by id at /v1/responses/{id}"),
    Switch("VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "every user's responses written to the engine's log"),
)
# Flags and variables in the conditions around a route's registration that open nothing a key holder
# could reach or use against others: engineArgs and env may set them (the derived-facts test holds
# every such name to ADMIN_FLAGS, ADMIN_ENV or this table).
QUIET_SWITCHES = (
    Switch("--disable-fastapi-docs", "turns /docs, /redoc and /openapi.json off (the operator passes it)"),
    Switch("--enable-offline-docs", "/docs and its assets under /static, which the allowlist refuses"),
    Switch(
        "--enable-tokenizer-info-endpoint", "/tokenizer_info, the tokenizer's settings, which the allowlist refuses"
    ),
    Switch("VLLM_ENABLE_COHERE_API", "/cohere/v2/chat, an inference route the allowlist refuses"),
)
# Registrations whose path is computed at run time, by their expression.
COMPUTED_PATHS = (
    (
        "route.path",
        "scale_out/factories.py: 403 answers at the scale-out routes' paths while --enable-scale-out is off",
    ),
    ("app.swagger_ui_oauth2_redirect_url", "serve/instrumentator/offline_docs.py: /docs/oauth2-redirect"),
)
# Files that register routes on servers other than `vllm serve`'s API server.
OTHER_SERVERS = (
    ("vllm/entrypoints/cli/preload.py", "the preloading launcher's own /health, on a port of its own"),
    ("vllm/entrypoints/launchers/dp_supervisor.py", "the data parallel supervisor's /health and /ready"),
)

ENGINE = VLLM(
    name="vllm",
    title="vLLM",
    profile="high-throughput",
    summary="vLLM on GPUs",
    version=VERSION,
    image=f"vllm/vllm-openai:v{VERSION}",
    command=("vllm", "serve"),  # the image's own ENTRYPOINT; the model comes first in the arguments
    port=8000,
    health_path="/health",
    metrics_path="/metrics",
    shm_size="16Gi",
    metric_prefix="vllm:",
    on_gpus=True,
    routes=engine_routes.VLLM,
    tool_call_parsers=TOOL_CALL_PARSERS,
    load_formats=LOAD_FORMATS,
    # vLLM's FlexibleArgumentParser, an argparse parser, reads `_` as `-` in long flags and takes
    # unambiguous prefixes.
    abbreviated_flags=True,
    underscored_flags=True,
    spans_nodes=True,  # a Ray cluster over the group's pods (launch)
    # vLLM 0.33.0's spellings (engine/arg_utils.py): the short -tp and -pp are flags of their own.
    group_flags=(
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--distributed-executor-backend",
    ),
    admin_flags=ADMIN_FLAGS,
    admin_env=ADMIN_ENV,
    previous_version="0.32.0",  # it removed no flag of 0.32.0
    unknown_flag_error="error: unrecognized arguments: FLAG",
    adapter_api=AdapterApi.VLLM,
    # --max-num-seqs unset, vLLM 0.33.0 batches 256 sequences on a GPU under 70 GiB (and on an A100 or,
    # new in 0.33.0, a GB10), 1024 on larger ones (H100, H200, B200): EngineArgs.get_batch_defaults,
    # engine/arg_utils.py. The
    # larger: a sidecar bound below the engine's batch throttles it, one above only leaves the excess
    # to vLLM's own queue, first come first served. `batch_size` below adds its multipliers.
    batch_flags=("--max-num-seqs",),
    default_batch=1024,
    # High-throughput: a replica fills a large batch before the autoscaler adds one.
    default_target=64,
    # Non-root, HOME, ~/.cache (vLLM's compile cache, FlashInfer's and Triton's kernels) and /tmp (Ray's
    # session, torch's compile cache) on volumes; the root filesystem writable for the NVIDIA toolkit's
    # hooks only (base.py).
    run_as_user=NONROOT_UID,
    read_only_root=False,
    user_caches=True,
)
