"""Checks on a request body that save an engine round trip, and sampling defaults (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from modelserve.contracts.routes import Route
from modelserve.http.errors import ErrorResponse, bad_request

IMAGE_PART_TYPES = frozenset({"image_url"})


def check_body(
    route: Route,
    body: bytes,
    served_model: str,
    vision: bool,
    sampling_defaults: Mapping[str, Any],
    sampling_aliases: Mapping[str, str] = MappingProxyType({}),
    upstream_model: str = "",
    adapter_models: Mapping[str, str] = MappingProxyType({}),
) -> bytes | ErrorResponse:
    """The body to send to the engine for a POST consumer route (the same bytes when nothing
    changes), or the error to answer with. Every such route takes a JSON object and gets the same
    checks; `sampling_aliases`: OpenAI name -> the engine's own name of a sampling field;
    `upstream_model`: the upstream's own model id, sent instead of the client's (the served name);
    `adapter_models`: an adapter's name -> how the engine is asked for it (SGLang's <base>:<adapter>)."""
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return bad_request(f"Request body is not valid JSON: {exc}", "invalid_json")
    if not isinstance(request, dict):
        return bad_request("Request body must be a JSON object.", "invalid_json")
    if not vision and _has_image_part(request):
        # vLLM's own words, so a client sees the same error with or without the sidecar.
        return bad_request(f"{served_model} is not a multimodal model", "not_multimodal", "messages")
    changes: dict[str, Any] = {}
    if upstream_model and request.get("model") != upstream_model:
        # An external server knows its model by its own id; this ModelServer serves only that one.
        changes["model"] = upstream_model
    engine_name = adapter_models.get(request.get("model")) if isinstance(request.get("model"), str) else None
    if engine_name is not None and engine_name != request["model"]:
        changes["model"] = engine_name
    if route.samples:
        changes.update(missing_sampling(request, _named_for(route, sampling_defaults)))
        if sampling_aliases:
            changes.update(engine_names({**request, **changes}, sampling_aliases))
    changes.update({name: value for name, value in route.forced if request.get(name) is not value})
    return json.dumps({**request, **changes}).encode() if changes else body


def request_model(body: bytes) -> str | None:
    """The `model` a checked (valid JSON object) body names, if a string."""
    model = json.loads(body).get("model")
    return model if isinstance(model, str) else None


def _named_for(route: Route, defaults: Mapping[str, Any]) -> Mapping[str, Any]:
    """The defaults under the route's own field names (the Responses API's max_output_tokens)."""
    if "max_tokens" not in defaults or route.max_tokens_field == "max_tokens":
        return defaults
    named = {name: value for name, value in defaults.items() if name != "max_tokens"}
    return {**named, route.max_tokens_field: defaults["max_tokens"]}


def missing_sampling(request: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults the request leaves out (absent or null: OpenAI clients mean "server default")."""
    missing = {k: v for k, v in defaults.items() if request.get(k) is None}
    # Newer OpenAI clients send max_completion_tokens, which engines prefer over max_tokens.
    if request.get("max_completion_tokens") is not None:
        missing.pop("max_tokens", None)
    return missing


def engine_names(request: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """The values to copy under the engine's own names: each aliased field the request sets, where
    the request does not already set the engine's name itself (its own choice wins)."""
    return {
        engine: request[name]
        for name, engine in aliases.items()
        if request.get(name) is not None and request.get(engine) is None
    }


def _has_image_part(request: Mapping[str, Any]) -> bool:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                    return True
    return False
