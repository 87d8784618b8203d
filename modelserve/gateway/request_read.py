"""What the gateway reads of a request's body to route it (pure): the JSON request and the model it
names, whether it streams, and the opening a conversation is keyed by. A body of very many JSON values
is read in the off-loop process (http/off_loop.py) instead of on the event loop: what comes back is
this small summary, and a body renamed there (a namespace-qualified or version name) comes back as
bytes, never as the millions of values it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelserve.http import errors
from modelserve.http.json_body import BadJson, encode, parse

from . import errors as gateway_errors
from .routing import conversation_prefix


@dataclass(frozen=True)
class RequestRead:
    model: str
    stream: bool  # "stream": true
    conversation: bytes | None  # routing.conversation_prefix


def parse_request(body: bytes) -> tuple[dict[str, Any], errors.ErrorResponse | None]:
    """The JSON request and its `model`, or the 400 to answer with."""
    request = parse(body)
    if isinstance(request, BadJson):
        return {}, errors.invalid_json(request.reason)
    if not isinstance(request, dict):
        return {}, errors.bad_request("Request body must be a JSON object.", "invalid_json")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        return {}, gateway_errors.missing_model()
    return request, None


def read(body: bytes) -> RequestRead | errors.ErrorResponse:
    """The summary a body too large to read on the loop is read to."""
    request, refusal = parse_request(body)
    if refusal is not None:
        return refusal
    return RequestRead(request["model"], request.get("stream") is True, conversation_prefix(request))


def renamed(body: bytes, model: str) -> bytes | errors.ErrorResponse:
    """The body with `model` in place of the one it names (read and written again)."""
    request, refusal = parse_request(body)
    if refusal is not None:
        return refusal
    return with_model(request, model)


def with_model(request: dict[str, Any], model: str) -> bytes | errors.ErrorResponse:
    written = encode({**request, "model": model})
    return errors.invalid_json(written.reason) if isinstance(written, BadJson) else written
