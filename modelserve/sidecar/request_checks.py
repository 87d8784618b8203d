"""Checks on a request body that save an engine round trip, and sampling defaults (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from modelserve.contracts.routes import Route
from modelserve.http.errors import ErrorResponse, bad_request, invalid_json
from modelserve.http.json_body import BadJson, encode, parse

# What only a multimodal model reads: the content parts of these types (Chat Completions', the
# Responses API's, vLLM's own), and a part with a field of one of these names (vLLM takes a part
# without a `type` by the media field it carries).
MEDIA_PARTS = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "image_pil",
        "image_embeds",
        "video_url",
        "video",
        "audio_url",
        "input_audio",
        "audio",
        "audio_embeds",
        "file",
        "input_file",
    }
)
# Where a request carries content parts: Chat Completions' (and vLLM's chat-style embeddings')
# `messages`, the Responses API's `input` items.
_TURNS = ("messages", "input")


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
    request = parse(body)
    if isinstance(request, BadJson):
        return invalid_json(request.reason)
    if not isinstance(request, dict):
        return bad_request("Request body must be a JSON object.", "invalid_json")
    media = None if vision else media_field(request)
    if media is not None:
        # vLLM's own words, so a client sees the same error with or without the sidecar.
        return bad_request(f"{served_model} is not a multimodal model", "not_multimodal", media)
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
    if not changes:
        return body
    changed = encode({**request, **changes})
    return invalid_json(changed.reason) if isinstance(changed, BadJson) else changed


@dataclass(frozen=True)
class Checked:
    """A body checked off the event loop (http/off_loop.py): what to send, and the model it names."""

    body: bytes
    model: str | None  # request_model's, asked for only where the caller counts usage per adapter


def checked_off_loop(
    route: Route,
    body: bytes,
    served_model: str,
    vision: bool,
    sampling_defaults: dict[str, Any],
    sampling_aliases: dict[str, str],
    upstream_model: str,
    adapter_models: dict[str, str] | None,
) -> Checked | ErrorResponse:
    """check_body in the helper process (plain dicts: a mapping proxy does not pickle); with
    `adapter_models` (None: no adapters served), the model the checked body names too."""
    checked = check_body(
        route, body, served_model, vision, sampling_defaults, sampling_aliases, upstream_model, adapter_models or {}
    )
    if isinstance(checked, ErrorResponse):
        return checked
    return Checked(checked, request_model(checked) if adapter_models is not None else None)


def request_model(body: bytes) -> str | None:
    """The `model` a checked (valid JSON object) body names, if a string."""
    request = parse(body)
    model = request.get("model") if isinstance(request, dict) else None
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


def media_field(request: Mapping[str, Any]) -> str | None:
    """The field (`messages` or `input`) whose turns carry a media part, or None: a turn's content is
    a string, a list of parts or (as some clients send it) one part."""
    for field in _TURNS:
        turns = request.get(field)
        for turn in turns if isinstance(turns, list) else ():
            content = turn.get("content") if isinstance(turn, dict) else None
            parts = [content] if isinstance(content, dict) else content if isinstance(content, list) else ()
            for part in parts:
                if is_media(part):
                    return field
    return None


def is_media(part: Any) -> bool:
    """A content part only a multimodal model reads, by its type or by a media field it carries."""
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return (isinstance(kind, str) and kind in MEDIA_PARTS) or not MEDIA_PARTS.isdisjoint(part)
