"""A held stream's answer, started before its model is up, so that the client and whatever sits in
between (a proxy that cuts a connection idle for 60 s, a load balancer waiting for a first byte)
see it alive while the model wakes.

An OpenAI stream (`"stream": true` on /v1/chat/completions or /v1/completions) still held after the
keep-alive interval gets the head of its answer (200, text/event-stream), and from then on an SSE
comment every interval:

    : waiting for tiny to start (6 s so far; its last start took 12 s)

(the second part where the ModelServer's status says how long its last replica start took).

SSE clients skip comment lines (the openai SDK's decoder drops every line that starts with ':').
The stream's first event is the model's first chunk. Its status cannot change once sent: any answer
but a 2xx (the hold timed out; the replica's 401, 400 or 503) comes as one event in OpenAI's error
shape, `data: {"error": {...}}`, and the stream ends there, without `data: [DONE]` (the openai SDK
raises it as an APIError). A hold shorter than the interval shows nothing: its answer keeps its own
status and headers.

Ollama's streams (NDJSON, /api/chat and /api/generate) get nothing while held: NDJSON has no
comment, and Ollama's clients (ollama-python, the CLI's Go client) parse every line as JSON, a
blank one included, and wait without a read timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from modelserve.http.downstream import Downstream, Exchange, Headers
from modelserve.http.errors import INVALID_REQUEST_ERROR, SERVER_ERROR
from modelserve.http.json_body import BadJson, encode, parse

# The head of a held stream's answer. No buffering, so that a proxy (nginx's ingress) passes the
# comments on as they come instead of holding them.
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# What of an error answer is kept to word its event (a sidecar's or an engine's: a few hundred bytes).
ERROR_BODY_LIMIT = 64 * 1024


def comment(name: str, waited: float, expected: float | None = None) -> bytes:
    """One keep-alive: an SSE comment line and the blank line after it (pure). `name`: the
    ModelServer's (a Kubernetes name: no line break); `expected`: its last start's seconds, as the
    operator measured it (status.lastStart), when known."""
    if expected:
        return b": waiting for %s to start (%d s so far; its last start took %d s)\n\n" % (
            name.encode(),
            int(waited),
            round(expected),
        )
    return b": waiting for %s to start (%d s so far)\n\n" % (name.encode(), int(waited))


def error_event(status: int, body: bytes) -> bytes:
    """An error answer as one SSE event in OpenAI's error shape (pure): its own `error` object when
    it has one (the gateway's, a sidecar's, vLLM's, llama.cpp's), else its words wrapped in one."""
    parsed = parse(body)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        text = error if isinstance(error, str) else body.decode("utf-8", "replace").strip()
        error = {
            "message": text or f"The model answered {status}.",
            "type": SERVER_ERROR if status >= 500 else INVALID_REQUEST_ERROR,
            "param": None,
            "code": None,
        }
    event = encode({"error": error})
    if isinstance(event, BadJson):  # an error object nested beyond what json writes
        return error_event(status, b"")
    return b"data: " + event + b"\n\n"  # json.dumps escapes line breaks: one line


class KeepAlive:
    """A held stream's keep-alives, in a task of their own while its request is held: after the first
    interval the answer's head, then a comment every interval, until `stop`."""

    def __init__(
        self, client: Downstream, interval: float, comment: Callable[[], bytes], sent: Callable[[], None]
    ) -> None:
        self.client = client
        self.interval = interval
        self.comment = comment
        self.sent = sent  # the keep-alive counter
        self.started = False  # the answer's head went out
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not await self._stopped_within(self.interval):
            if not self.started:
                await self.client.start(200, list(SSE_HEADERS))
                self.started = True  # no await between the head's write and here: never sent twice
            await self.client.write(self.comment())
            self.sent()

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> bool:
        """No more comments (one being written goes out whole first); whether the answer started."""
        self._stop.set()
        await self._task
        return self.started

    def cancel(self) -> None:
        """The request is cancelled itself (shutdown): its connection goes, whatever was written."""
        self._task.cancel()


class StartedStream:
    """The Downstream of a held stream whose answer its keep-alives started: whatever the pipeline
    answers goes into that answer's body; a 2xx as it is, anything else as one error event."""

    __slots__ = ("_error", "_status", "client")

    def __init__(self, client: Downstream) -> None:
        self.client = client
        self._status = 200
        self._error: bytearray | None = None  # an error answer's body while it arrives

    async def read_body(self, limit: int) -> bytes | None:
        return await self.client.read_body(limit)

    async def start(self, status: int, headers: Headers) -> None:
        # The head went out with the first comment: this one is dropped (the replica's header too).
        if not 200 <= status < 300:
            self._status = status
            self._error = bytearray()

    async def write(self, chunk: bytes) -> None:
        if self._error is None:
            await self.client.write(chunk)
        else:
            self._keep(chunk)

    async def end(self, chunk: bytes = b"") -> None:
        if self._error is None:
            await self.client.end(chunk)
            return
        self._keep(chunk)
        await self.client.end(error_event(self._status, bytes(self._error)))

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        await self.start(status, headers)
        await self.end(body)

    def gone(self) -> asyncio.Future[None]:
        return self.client.gone()

    def cancel_on_disconnect(self, exchange: Exchange) -> None:
        self.client.cancel_on_disconnect(exchange)

    def _keep(self, chunk: bytes) -> None:
        assert self._error is not None
        room = ERROR_BODY_LIMIT - len(self._error)
        if room > 0:
            self._error += chunk[:room]
