"""The OpenAI chat API as `modelserve run` speaks it: one streamed request per turn.

The standard library's urllib only (the CLI's runtime deps have no OpenAI client); the parsing
helpers are pure.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# A token can take long on a busy CPU engine; this bounds a wait for the next byte, not the answer.
READ_TIMEOUT_SECONDS = 300
IMAGE_TYPES = {  # magic bytes -> media type, as the sidecar sniffs them
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}


class ChatError(Exception):
    """The server refused or failed a request; `message` is its own explanation."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status} {message}" if status else message)
        self.status = status
        self.message = message


def base_url(url: str) -> str:
    """`http://host:port`, `.../` or `.../v1`: the /v1 base the chat route hangs under."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def error_message(body: bytes, fallback: str) -> str:
    """The server's words: OpenAI's `{"error": {"message"}}`, Ollama's `{"error": "..."}`, or the text."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    text = body.decode(errors="replace").strip()
    return text[:500] or fallback


def content_of(line: bytes) -> str | None:
    """The text of one SSE line of a chat stream ('' for lines without text, None at [DONE]).
    Raises ChatError for an error event the server sends inside the stream."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return ""
    data = line[5:].strip()
    if data == b"[DONE]":
        return None
    event = json.loads(data)
    if "error" in event:
        raise ChatError(None, error_message(data, "the stream failed"))
    choices = event.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def image_part(path: str) -> dict[str, Any]:
    """An `image_url` part with the file as a base64 data URL; OSError names a missing file."""
    data = Path(path).expanduser().read_bytes()
    media = next((kind for magic, kind in IMAGE_TYPES.items() if data.startswith(magic)), None)
    if media is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        media = "image/webp"
    if media is None:
        raise ValueError(f"{path} is not a PNG, JPEG, GIF or WebP image")
    url = f"data:{media};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def stream_lines(lines: Iterable[bytes], write: Callable[[str], None]) -> str:
    """Writes each piece of text as it arrives; returns the whole answer."""
    answer = ""
    for line in lines:
        text = content_of(line)
        if text is None:
            break
        if text:
            write(text)
            answer += text
    return answer


def chat(url: str, model: str, key: str | None, messages: list[dict[str, Any]], write: Callable[[str], None]) -> str:
    """One streamed chat completion; the text goes to `write` as it is generated."""
    # Usage in the last event: the sidecar counts the tokens in its metrics, as for any client.
    request_body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    body = json.dumps(request_body).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base_url(url) + "/chat/completions", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT_SECONDS) as response:
            answer = stream_lines(response, write)
            # Read to the end of the body: hanging up right after [DONE] would cut the server's
            # last bytes, and it would count a stream the client closed.
            response.read()
            return answer
    except urllib.error.HTTPError as error:
        raise ChatError(error.code, error_message(error.read(), error.reason)) from None
    except urllib.error.URLError as error:
        raise ChatError(None, f"cannot reach {url}: {error.reason}") from None
    except (TimeoutError, ConnectionError) as error:
        raise ChatError(None, f"the connection to {url} failed: {error}") from None
