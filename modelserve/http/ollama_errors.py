"""Ollama's error shape for any answer: a `send` that words every error (status >= 400) as
`{"error": "<text>"}`, whoever wrote it (a proxy's refusal, a replica's sidecar, an engine). The
sidecar's Ollama adapter and both proxies' allowlist use it."""

from __future__ import annotations

from typing import Any

from . import ollama

# Headers of an error answer worth keeping when its body is translated.
KEPT_ON_ERRORS = frozenset({b"www-authenticate", b"retry-after", b"connection"})


async def send_whole(send: Any, status: int, body: bytes, content_type: bytes, headers: list) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class OllamaErrors:
    """A `send` that gives every error answer (status >= 400) in Ollama's shape, `{"error": "<text>"}`,
    whoever wrote it (the proxy's refusals, the gateway's, a replica's sidecar, an engine), and
    passes other answers through as they come."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], message["headers"]
            if self.status < 400:
                await self.send(message)
            return
        if self.status < 400:
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if not message.get("more_body", False):
            await self.send_error()

    async def send_error(self) -> None:
        body = ollama.error_body(ollama.error_message(self.body, self.status))
        kept = [(n, v) for n, v in self.headers if n.lower() in KEPT_ON_ERRORS]
        await send_whole(self.send, self.status, body, b"application/json", kept)
