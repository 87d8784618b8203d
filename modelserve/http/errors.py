"""OpenAI-shaped error responses the sidecar produces itself (the engine's own pass through)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# OpenAI's error `type` vocabulary; `code` says precisely what went wrong.
AUTHENTICATION_ERROR = "authentication_error"
INVALID_REQUEST_ERROR = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT_ERROR = "rate_limit_error"


@dataclass(frozen=True)
class ErrorResponse:
    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()

    def headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *self.extra_headers,
        ]


_CHALLENGE = ((b"www-authenticate", b'Bearer realm="modelserve", Key realm="modelserve"'),)

# Why a key was refused -> (message, code). The reason is also the metrics label.
_AUTH_FAILURES = {
    "missing": (
        "Missing API key: send 'Authorization: Bearer <key>' or 'Authorization: Key <key>'.",
        "missing_api_key",
    ),
    "malformed": ("Malformed Authorization header: expected 'Bearer <key>' or 'Key <key>'.", "malformed_authorization"),
    "invalid": ("Invalid API key.", "invalid_api_key"),
    "expired": ("This API key has expired.", "expired_api_key"),
}


def unauthorized(reason: str) -> ErrorResponse:
    message, code = _AUTH_FAILURES[reason]
    return ErrorResponse(401, message, AUTHENTICATION_ERROR, code, extra_headers=_CHALLENGE)


def retry_after(seconds: float) -> tuple[tuple[bytes, bytes], ...]:
    """The `Retry-After` header: whole seconds, at least 1 (0 would invite a retry at once)."""
    return ((b"retry-after", str(max(1, math.ceil(seconds))).encode()),)


def too_many_requests(message: str, code: str, retry_after_seconds: float | None) -> ErrorResponse:
    """A limit reached (OpenAI's 429 `rate_limit_exceeded` family); `Retry-After` when a wait is known."""
    extra = () if retry_after_seconds is None else retry_after(retry_after_seconds)
    return ErrorResponse(429, message, RATE_LIMIT_ERROR, code, extra_headers=extra)


def bad_request(message: str, code: str, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(400, message, INVALID_REQUEST_ERROR, code, param)


def invalid_json(reason: str) -> ErrorResponse:
    return bad_request(f"Request body is not valid JSON: {reason}", "invalid_json")


def body_not_allowed(method: str, path: str) -> ErrorResponse:
    return bad_request(f"A {method} {path} request takes no body.", "body_not_allowed")


def body_too_large(limit: int) -> ErrorResponse:
    message = f"Request body is larger than the limit of {limit} bytes."
    return ErrorResponse(413, message, INVALID_REQUEST_ERROR, "body_too_large")


def too_many_values(limit_bytes: int) -> ErrorResponse:
    """A body whose JSON values would take more memory to read than the reader may use."""
    message = f"Request body holds more JSON values than can be read within {limit_bytes // (1024 * 1024)} MiB."
    return ErrorResponse(413, message, INVALID_REQUEST_ERROR, "too_many_values")


def engine_unavailable(retry_after_seconds: int) -> ErrorResponse:
    return ErrorResponse(
        503,
        "The model engine is not reachable (starting, restarting or overloaded); retry later.",
        SERVER_ERROR,
        "engine_unavailable",
        extra_headers=retry_after(retry_after_seconds),
    )


def server_busy(message: str) -> ErrorResponse:
    """This process is at one of its bounds (limits.py's refusals say the same, closing)."""
    return ErrorResponse(503, message, SERVER_ERROR, "server_busy", extra_headers=retry_after(1))


def engine_busy(waited_seconds: float, retry_after_seconds: int) -> ErrorResponse:
    """A request that waited its turn at a full engine for the whole upstream timeout."""
    return ErrorResponse(
        503,
        f"The model engine was busy with other requests for {waited_seconds:g} s; retry later.",
        SERVER_ERROR,
        "engine_busy",
        extra_headers=retry_after(retry_after_seconds),
    )


def upstream_timeout(seconds: float) -> ErrorResponse:
    return ErrorResponse(504, f"The model engine sent nothing for {seconds:g} s.", SERVER_ERROR, "engine_timeout")


def unknown_route(method: str, path: str) -> ErrorResponse:
    """A request outside the consumer routes (routes.py), in OpenAI's words for an unknown URL."""
    shown = path if len(path) <= 200 else path[:200] + "..."
    return ErrorResponse(
        404,
        f"Invalid URL ({method} {shown}): not an inference route of this model.",
        INVALID_REQUEST_ERROR,
        "unknown_route",
    )
