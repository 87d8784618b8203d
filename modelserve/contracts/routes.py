"""The routes a model consumer may call, by method and exact decoded path: the allowlist the sidecar
and the gateway apply before anything else (pure, standard library only).

Engines serve far more than inference on their HTTP port: weight replacement, request aborts,
profilers, slot state, prompt logging (vLLM, SGLang and llama.cpp alike; the tests keep each engine's
route table, read from its source). A key opens the model, not the engine: a request whose method
and path are not in CONSUMER_ROUTES is answered 404 by the proxy itself and never forwarded, and an
allowed one is forwarded to the path that was checked (the route's own spelling), never the raw path
the client sent. The table is the same for every engine: each route has the same path, method and
meaning on vLLM, SGLang and llama.cpp, and the one engine difference that matters (SGLang stores
every Responses API answer unless told not to) is closed by the request checks, which send
`store: false` on every engine.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# The error shapes: OpenAI's `{"error": {"message", "type", "param", "code"}}`, Ollama's `{"error": "<text>"}`.
OPENAI = "openai"
OLLAMA = "ollama"
OLLAMA_PREFIX = "/api/"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    # The sampling defaults apply (the request generates tokens).
    samples: bool = False
    # The answer's `usage` is counted (prompt and completion tokens).
    metered: bool = False
    # The request's name for the sampling default `max_tokens`.
    max_tokens_field: str = "max_tokens"
    # Fields the sidecar always sets, whatever the request says.
    forced: tuple[tuple[str, object], ...] = ()


CHAT = Route("POST", "/v1/chat/completions", samples=True, metered=True)
COMPLETIONS = Route("POST", "/v1/completions", samples=True, metered=True)
# Never stored: SGLang keeps every stored answer in memory, unbounded, readable by id with any key.
RESPONSES = Route(
    "POST",
    "/v1/responses",
    samples=True,
    metered=True,
    max_tokens_field="max_output_tokens",
    forced=(("store", False),),
)
EMBEDDINGS = Route("POST", "/v1/embeddings", metered=True)
MODELS = Route("GET", "/v1/models")
# Token counting for a context budget: the same path and no side effect on every engine.
TOKENIZE = Route("POST", "/tokenize")
DETOKENIZE = Route("POST", "/detokenize")
# Ollama's API, which the sidecar translates to the routes above (ollama.py).
OLLAMA_CHAT = Route("POST", "/api/chat")
OLLAMA_GENERATE = Route("POST", "/api/generate")
OLLAMA_TAGS = Route("GET", "/api/tags")
OLLAMA_SHOW = Route("POST", "/api/show")
OLLAMA_VERSION = Route("GET", "/api/version")
OLLAMA_PS = Route("GET", "/api/ps")

CONSUMER_ROUTES: Mapping[tuple[str, str], Route] = MappingProxyType(
    {
        (route.method, route.path): route
        for route in (
            CHAT,
            COMPLETIONS,
            RESPONSES,
            EMBEDDINGS,
            MODELS,
            TOKENIZE,
            DETOKENIZE,
            OLLAMA_CHAT,
            OLLAMA_GENERATE,
            OLLAMA_TAGS,
            OLLAMA_SHOW,
            OLLAMA_VERSION,
            OLLAMA_PS,
        )
    }
)
ALLOWED_PATHS = frozenset(path for _, path in CONSUMER_ROUTES)
# The consumer routes sent to the engine as they are (Ollama's are translated into these first).
FORWARDED: Mapping[tuple[str, str], Route] = MappingProxyType(
    {key: route for key, route in CONSUMER_ROUTES.items() if not route.path.startswith(OLLAMA_PREFIX)}
)

# Why a request was refused: the `route_class` label of the refusal counters.
WRONG_METHOD = "method"  # an allowed path with another method (HEAD, OPTIONS, PUT, ...)
SPELLING = "spelling"  # another spelling of a known path: `//`, dot segments, trailing slash, case
ENGINE_ALIAS = "engine_alias"  # an inference route an engine serves outside the allowlist
ENGINE_ADMIN = "engine_admin"  # an engine's administration, debugging or information route
UNKNOWN = "unknown"
REFUSAL_CLASSES = (WRONG_METHOD, SPELLING, ENGINE_ALIAS, ENGINE_ADMIN, UNKNOWN)

# Inference routes the pinned engines serve that consumers do not get: aliases without the sidecar's
# checks, other vendors' APIs, and stateful or engine-specific ones.
_ENGINE_ALIASES = frozenset(
    {
        "/completion",
        "/completions",
        "/chat/completions",
        "/v1/chat/completions/batch",
        "/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/tokenize",
        "/v1/detokenize",
        "/apply-template",
        "/infill",
        "/embedding",
        "/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
        "/v2/rerank",
        "/v2/embed",
        "/score",
        "/v1/score",
        "/pooling",
        "/classify",
        "/v1/classify",
        "/audio/transcriptions",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/realtime",
        "/models",
        "/generate",
        "/encode",
        "/invocations",
        "/vertex_generate",
        "/generative_scoring",
        "/v1/systemone",
        "/cohere/v2/chat",
        "/parse_function_call",
        "/separate_reasoning",
        "/inference/v1/generate",
        "/v1/chat/completions/render",
        "/v1/chat/completions/derender",
        "/v1/completions/render",
        "/v1/completions/derender",
        "/v1/messages/render",
        "/v1/responses/render",
    }
)
# Parametric inference routes, by their fixed prefix (stored responses by id, one model by id).
_ENGINE_ALIAS_PREFIXES = ("/v1/responses/", "/v1/models/")
# The engines' administration, debugging and information routes (weights, aborts, profilers, slots,
# caches, logging, server arguments, health, docs, the web UI).
_ENGINE_ADMIN = frozenset(
    {
        # all or several engines
        "/",
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
        # vLLM 0.32.0
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
        # SGLang 0.5.10
        "/health_generate",
        "/model_info",
        "/get_model_info",
        "/weight_version",
        "/get_weight_version",
        "/get_server_info",
        "/get_load",
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
        "/clear_hicache_storage_backend",
        "/open_session",
        "/close_session",
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/load_lora_adapter_from_tensors",
        # llama.cpp b9093
        "/v1/health",
        "/props",
        "/slots",
        "/lora-adapters",
        "/bundle.js",
        "/bundle.css",
        "/cors-proxy",
        "/tools",
        "/models/load",
        "/models/unload",
        "/predict",
    }
)
# Parametric administration routes, by their fixed prefix; `/metrics` and `/docs` because vLLM and
# SGLang serve any path under them.
_ENGINE_ADMIN_PREFIXES = ("/slots/", "/dumper/", "/hicache/", "/adapters/", "/metrics", "/docs")


def allowed(method: str, path: str) -> Route | None:
    """The consumer route a request's method and decoded path name exactly, or None."""
    return CONSUMER_ROUTES.get((method, path))


def error_shape(path: str) -> str:
    """The protocol whose error shape answers a request: Ollama's under /api/ (in any spelling), else OpenAI's."""
    return OLLAMA if _canonical(path).startswith(OLLAMA_PREFIX) else OPENAI


def refusal_class(path: str) -> str:
    """Why a request `allowed` refused was refused (a REFUSAL_CLASSES label), by its decoded path."""
    if path in ALLOWED_PATHS:
        return WRONG_METHOD
    canonical = _canonical(path)
    if canonical != path and (canonical in ALLOWED_PATHS or canonical in _ENGINE_ALIASES or canonical in _ENGINE_ADMIN):
        return SPELLING
    if path in _ENGINE_ALIASES or path.startswith(_ENGINE_ALIAS_PREFIXES):
        return ENGINE_ALIAS
    if path in _ENGINE_ADMIN or path.startswith(_ENGINE_ADMIN_PREFIXES):
        return ENGINE_ADMIN
    return UNKNOWN


def _canonical(path: str) -> str:
    """The path a lenient server might route `path` to: dot segments resolved, `//` collapsed,
    trailing slash dropped, lower case."""
    return posixpath.normpath("/" + path.lstrip("/")).lower()
