"""The routes a model consumer may call, by method and exact decoded path: the allowlist the sidecar
and the gateway apply before anything else (pure, standard library only).

Engines serve far more than inference on their HTTP port: weight replacement, request aborts,
profilers, slot state, prompt logging (vLLM, SGLang and llama.cpp alike; engine_routes.py has each
engine's, read from its source). A key opens the model, not the engine: a request whose method
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

from . import engine_routes

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

# Every pinned engine's routes outside the allowlist, merged: a refusal's class does not depend on
# which engine the pod runs (the gateway serves them all). One table per engine in engine_routes.py.
_ENGINE_ALIASES = frozenset().union(*(table.aliases for table in engine_routes.TABLES))
_ENGINE_ALIAS_PREFIXES = tuple(dict.fromkeys(p for table in engine_routes.TABLES for p in table.alias_prefixes))
_ENGINE_ADMIN = frozenset().union(*(table.admin for table in engine_routes.TABLES))
_ENGINE_ADMIN_PREFIXES = tuple(dict.fromkeys(p for table in engine_routes.TABLES for p in table.admin_prefixes))


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
