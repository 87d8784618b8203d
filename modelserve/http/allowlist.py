"""The first step of the sidecar and the gateway for every request outside their own routes: a request
that is not a consumer route (routes.py) is answered 404 here, in its protocol's error shape, and
counted by why; it never reaches an engine."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from modelserve.contracts import routes

from . import errors
from .ollama_errors import OllamaErrors
from .relay import respond


def in_error_shape(send: Any, path: str) -> Any:
    """`send`, or under Ollama's /api/ a `send` that words every error answer Ollama's way."""
    return OllamaErrors(send) if routes.error_shape(path) == routes.OLLAMA else send


async def refuse(scope: dict[str, Any], send: Any, refused: Counter) -> None:
    """Answer a request `routes.allowed` refused; `refused`: the counter by route class."""
    method, path = scope["method"], scope["path"]
    refused.labels(routes.refusal_class(path)).inc()
    await respond(in_error_shape(send, path), errors.unknown_route(method, path))
