"""Serves Ollama's `/api/*` routes by wrapping the proxy: each request is rewritten into the engine's
OpenAI request (`ollama.plan`), handed to the proxy, and the proxy's answer translated back as it is
sent. Keys, body limit, request checks, sampling defaults, demand and metrics are the proxy's own."""

from __future__ import annotations

import json
import time
from time import perf_counter
from typing import Any

from modelserve.contracts.names import PACKAGE_VERSION
from modelserve.contracts.sidecar import Settings
from modelserve.http import off_loop, ollama
from modelserve.http.downstream import ClientGone, read_body
from modelserve.http.json_body import BadJson, parse
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.ollama_errors import OllamaErrors, send_whole
from modelserve.http.pipeline import ROUTE_SCOPE_KEY
from modelserve.http.relay import content_length

from .auth import identify
from .metrics import route_label
from .proxy import Proxy

# Request headers replaced for the rewritten body; Accept-Encoding is dropped so the engine
# answers uncompressed bytes the translation can read.
_REWRITTEN = frozenset({b"content-length", b"content-type", b"accept-encoding", b"transfer-encoding"})


class OllamaAdapter:
    def __init__(self, proxy: Proxy, settings: Settings) -> None:
        self.proxy = proxy
        self.settings = settings
        self.version = ollama.version_string(PACKAGE_VERSION)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = perf_counter()
        route = scope["path"]
        headers = scope["headers"]
        limit = self.settings.max_body_bytes
        declared = content_length(headers)
        keys = self.proxy.keys
        entry, refused = identify(headers, keys, time.time()) if keys is not None else (None, None)
        if refused is not None or (declared is not None and declared > limit):
            # The proxy refuses these before it reads anything (and counts them as on /v1): the
            # caller learns nothing from the translation.
            await self.proxy({**scope, ROUTE_SCOPE_KEY: route}, receive, OllamaErrors(send))
            return

        try:
            body = await read_body(receive, limit)
        except ClientGone:
            self._count_here(route, CLIENT_CLOSED, start)
            return
        if body is None:
            refusal = ollama.Refusal(413, f"Request body is larger than the limit of {limit} bytes.")
            await self._answer_here(send, route, start, refusal, ((b"connection", b"close"),))
            return
        adapters = self.proxy.adapters
        names = adapters.names() if adapters is not None and adapters.enabled else ()
        peer = (scope.get("client") or ("",))[0]
        owner = self.proxy.owner(headers, peer, entry)  # once: its share of the loop, and its places off it
        if self.proxy.reads_off_loop(body, owner):
            planned = await self._plan_off_loop(route, body, tuple(names), owner)
        else:
            planned = ollama.plan(route, body, self.settings.served_model, names)
        if isinstance(planned, ollama.Refusal):
            await self._answer_here(send, route, start, planned)
            return

        kept = [(n, v) for n, v in headers if n.lower() not in _REWRITTEN]
        if planned.body:
            kept += [(b"content-type", b"application/json"), (b"content-length", str(len(planned.body)).encode())]
        engine_scope = {
            **scope,
            "method": planned.method,
            "path": planned.path,
            "headers": kept,
            ROUTE_SCOPE_KEY: route,
        }
        reply = _Reply(send, planned, self, start)
        await self.proxy(engine_scope, _replay(planned.body, receive), reply)

    async def _plan_off_loop(
        self, route: str, body: bytes, names: tuple[str, ...], owner: object
    ) -> ollama.Plan | ollama.Refusal:
        """ollama.plan in the proxy's helper process: a body of very many values (300,000 messages took
        the loop 0.5 s from every other key's requests), or past its key's share of the loop."""
        proxy = self.proxy
        planned = await proxy.off_loop_work.run(
            ollama.plan, route, body, self.settings.served_model, names, owner=owner
        )
        proxy.metrics.read_off_loop.labels(off_loop.outcome(planned)).inc()
        refusal = off_loop.refusal(planned, "sidecar", proxy.off_loop_work.memory_bytes)
        return planned if refusal is None else ollama.Refusal(refusal.status, refusal.message)

    async def _answer_here(
        self,
        send: Any,
        route: str,
        start: float,
        refusal: ollama.Refusal,
        extra: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        """Refusals after the key check, counted like the proxy counts its own."""
        body = refusal.body()
        await send_whole(send, refusal.status, body, b"application/json", list(extra))
        self._count_here(route, status_class(refusal.status), start)

    def _count_here(self, route: str, label: str, start: float) -> None:
        self.proxy.demand.arrived()
        self.proxy.metrics.observe(route_label(route), label, perf_counter() - start, None)


def _replay(body: bytes, receive: Any) -> Any:
    """A receive that gives the (rewritten) body once, then the client's own messages, so the
    proxy still sees a disconnect."""
    given = False

    async def replayed() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _ndjson(objects: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objects)


class _Reply(OllamaErrors):
    """Translates the proxy's answer as it is sent: an SSE stream line by line into NDJSON, a whole
    answer (JSON, or an error) once it is complete."""

    def __init__(self, send: Any, planned: ollama.Plan, adapter: OllamaAdapter, start: float) -> None:
        super().__init__(send)
        self.plan = planned
        self.adapter = adapter
        self.start = start
        self.first: float | None = None
        self.stream: ollama.StreamTranslator | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], message["headers"]
            content_type = next((v for n, v in self.headers if n.lower() == b"content-type"), b"")
            if self.status == 200 and content_type.startswith(b"text/event-stream"):
                self.stream = ollama.StreamTranslator(self.plan.route, self.plan.model)
                start = {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")],
                }
                await self.send(start)
            return
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if chunk and self.first is None:
            self.first = perf_counter()
        if self.stream is None:
            self.body += chunk
            if not more:
                await self._whole()
            return
        now = ollama.now_rfc3339()
        objects = self.stream.feed(chunk, now)
        if not more:
            objects += self.stream.finish(now, ollama.Clock(self.start, self.first, perf_counter()))
        if objects or not more:
            await self.send({"type": "http.response.body", "body": _ndjson(objects), "more_body": more})

    async def _whole(self) -> None:
        if self.status != 200:
            await self.send_error()
            return
        answer = parse(self.body)
        if isinstance(answer, BadJson):
            await send_whole(
                self.send, 502, ollama.error_body("the engine's answer is not JSON"), b"application/json", []
            )
            return
        plan, now = self.plan, ollama.now_rfc3339()
        served = self.adapter.settings.served_model
        if plan.done_reason:
            result = ollama.load_answer(plan.route, plan.model, now, plan.done_reason)
        elif plan.route == ollama.TAGS_ROUTE:
            result = ollama.tags_answer(answer, served)
        elif plan.route == ollama.PS_ROUTE:
            result = ollama.ps_answer(answer, served)
        elif plan.route == ollama.SHOW_ROUTE:
            result = ollama.show_answer(answer, served, self.adapter.settings.vision)
        elif plan.route == ollama.VERSION_ROUTE:
            result = {"version": self.adapter.version}
        else:
            clock = ollama.Clock(self.start, self.first, perf_counter())
            result = ollama.chat_answer(plan.route, answer, plan.model, now, clock)
        if plan.stream:  # asked for a stream, got one object: one NDJSON line
            await send_whole(self.send, 200, _ndjson([result]), ollama.NDJSON.encode(), [])
        else:
            await send_whole(
                self.send, 200, json.dumps(result, separators=(",", ":")).encode(), b"application/json", []
            )
