"""The proxy: a raw ASGI app that checks the key and the request, then streams the engine's answer
back chunk by chunk (relay.py, shared with the gateway), kept free of framework layers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from time import perf_counter
from typing import Any

from modelserve.contracts import routes
from modelserve.contracts.sidecar import Settings
from modelserve.http import errors
from modelserve.http.direct import DirectDownstream
from modelserve.http.downstream import AsgiDownstream, Downstream, Exchange, Headers, answer
from modelserve.http.express import FirstTry, Forward, answer_now
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.relay import HOP_BY_HOP, filter_headers, read_limited_body, relay, upstream_error_kind
from modelserve.http.upstream_pool import ConnectFailed, Disconnected, Pool, Response
from modelserve.http.usage import usage_from_tail

from .adapters import Adapters
from .auth import refusal_reason
from .demand import Demand
from .keys import KeyStore
from .metrics import ROUTE_SCOPE_KEY, SidecarMetrics, route_label
from .request_checks import check_body, request_model

log = logging.getLogger(__name__)

# Also not sent to the engine: Host and Content-Length (aiohttp sets both for the body it sends,
# which may have been rewritten), Expect (uvicorn already answered the client's 100-continue, and the
# whole body is here) and Authorization (the engine has no use for the key; keeps it out of its logs).
DROP_TO_ENGINE = HOP_BY_HOP | {b"host", b"content-length", b"expect", b"authorization"}
RETRY_AFTER_SECONDS = 5
# A request's route, the body to send the engine and its model label (with adapters only).
Planned = tuple[routes.Route, bytes, str | None]


class Proxy:
    def __init__(
        self, settings: Settings, keys: KeyStore | None, metrics: SidecarMetrics, adapters: Adapters | None = None
    ) -> None:
        self.settings = settings
        self.adapters = adapters  # None or disabled: the ModelServer serves its base model only
        self.keys = keys  # None in public mode
        self.metrics = metrics
        self.demand = Demand()
        # Read when scraped: the demand counts requests in flight already, without the gauge's lock.
        metrics.in_flight.set_function(lambda: self.demand.in_flight)
        self.pool: Pool | None = None  # opened by the app's lifespan
        self._targets = {path: settings.upstream_url + path for _, path in routes.FORWARDED}

    def key_refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> errors.ErrorResponse | None:
        """The 401 for a request whose key is refused (and counted), or None when it may pass."""
        if self.keys is None:
            return None
        reason = refusal_reason(headers, self.keys)
        if reason is None:
            return None
        self.metrics.auth_failures.labels(reason).inc()
        return errors.unauthorized(reason)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI way in: the Ollama adapter's, and any request the server's fast lane left to ASGI."""
        client = AsgiDownstream(receive, send)
        try:
            label = scope.get(ROUTE_SCOPE_KEY) or scope["path"]
            await self.serve(scope["method"], scope["path"], scope["headers"], label, client)
        finally:
            client.close()

    async def direct(self, request: DirectDownstream) -> None:
        """The server's fast lane (direct.py) for the consumer routes forwarded as they are."""
        await self.serve(request.method, request.path, request.headers, request.path, request)

    def admit(self, request: DirectDownstream) -> bool:
        """The fast lane's check of a request's head, before its body is read (direct.py): a refused
        key is answered 401 at once, so a keyless client never has a body buffered here."""
        refused = self.key_refusal(request.headers)
        if refused is None:
            return False
        exchange = Exchange(perf_counter())
        self.demand.in_flight += 1
        exchange.status = answer_now(request, refused)
        self._end(exchange, route_label(request.path))
        return True

    def express(self, request: DirectDownstream) -> bool:
        """The fast lane's first try (express.py): the same steps as `serve`, without awaiting, for a
        request whose body is in; the async way from where it cannot go on so."""
        if request.body_size > self.settings.max_body_bytes or request.write_paused or self.pool is None:
            return False  # the 413 (and its closed connection), or a client not reading: the async way's
        exchange = Exchange(perf_counter())
        route_name = route_label(request.path)
        self.demand.in_flight += 1

        def end() -> None:
            self._end(exchange, route_name)

        try:
            refused = None if request.admitted else self.key_refusal(request.headers)
            if refused is not None:
                exchange.status = answer_now(request, refused)
                end()
                return True
            self.demand.arrived()
            planned = self._plan(request.method, request.path, request.body())
            if isinstance(planned, errors.ErrorResponse):
                exchange.status = answer_now(request, planned)
                end()
                return True
        except BaseException:
            end()
            raise
        route, body, model = planned
        headers = request.headers

        async def go_on(outcome: FirstTry) -> None:
            try:
                await self._forward(headers, request, route, body, model, exchange, outcome)
            finally:
                end()

        def settle(tail: bytes | None, error: BaseException | None) -> None:
            self._settle(exchange, tail, error, model)

        forward = Forward(request, exchange, route.metered, None, settle, end, go_on)
        forward.send(self.pool, route.method, self._targets[route.path], filter_headers(headers, DROP_TO_ENGINE), body)
        return True

    async def serve(self, method: str, path: str, headers: Headers, label: str, client: Downstream) -> None:
        exchange = Exchange(perf_counter())
        route = route_label(label)
        self.demand.in_flight += 1
        try:
            await self._handle(method, path, headers, client, exchange)
        finally:
            self._end(exchange, route)

    def _end(self, exchange: Exchange, route: str) -> None:
        """Every request's count, however it ended."""
        self.demand.in_flight -= 1
        status = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
        self.metrics.observe(route, status, perf_counter() - exchange.start, exchange.ttfb)

    async def _handle(self, method: str, path: str, headers: Headers, client: Downstream, exchange: Exchange) -> None:
        refused = self.key_refusal(headers)
        if refused is not None:
            exchange.status = await answer(client, refused)
            return
        self.demand.arrived()

        body = await read_limited_body(headers, client, self.settings.max_body_bytes, exchange)
        if body is None:
            return
        planned = self._plan(method, path, body)
        if isinstance(planned, errors.ErrorResponse):
            exchange.status = await answer(client, planned)
            return
        await self._forward(headers, client, *planned, exchange)

    def _plan(
        self, method: str, path: str, body: bytes
    ) -> tuple[routes.Route, bytes, str | None] | errors.ErrorResponse:
        """The route, the body to send and the model label (with adapters) of a request whose key
        passed, or the error to answer with."""
        route = routes.FORWARDED.get((method, path))
        if route is None:
            # The dispatcher's allowlist (allowlist.py) sends only these, and so does the Ollama
            # adapter but for the requests it hands over to be refused (bad key, body too large),
            # which a key reloaded in between could let through to here: nothing else is forwarded.
            return errors.unknown_route(method, path)
        if route.method == "GET" and body:
            # Never forwarded: an engine that does not frame a GET's body would read it as a request
            # of its own (smuggled past the checks, its answer read by the next client).
            return errors.body_not_allowed(method, path)
        model = None
        if route.method == "POST":
            settings = self.settings
            adapters = self.adapters if self.adapters is not None and self.adapters.enabled else None
            checked = check_body(
                route,
                body,
                settings.served_model,
                settings.vision,
                settings.sampling_defaults,
                settings.sampling_aliases,
                settings.upstream_model,
                adapters.engine_names if adapters else {},
            )
            if isinstance(checked, errors.ErrorResponse):
                return checked
            body = checked
            if adapters:
                # Only with adapters: one more parse of the body, for usage per adapter.
                model = self._model_label(request_model(body), adapters)
        return route, body, model

    def _model_label(self, model: str | None, adapters: Adapters) -> str:
        """The served name or an adapter's name (as the client named it), else "other": bounded labels."""
        if model in adapters.adapter_names:
            return adapters.adapter_names[model]
        return self.settings.served_model if model in (None, self.settings.served_model) else "other"

    async def _forward(
        self,
        headers: Headers,
        client: Downstream,
        route: routes.Route,
        body: bytes,
        model: str | None,
        exchange: Exchange,
        first: FirstTry = None,
    ) -> None:
        # The route's own path, the one that was checked: never the raw path the client spelt, and no
        # query (no consumer route takes one; an engine might read one).
        target = self._targets[route.path]
        to_engine = filter_headers(headers, DROP_TO_ENGINE)
        tail, error = await relay(
            client,
            exchange,
            lambda: self._open(route.method, target, to_engine, body, first),
            self._failure,
            route.metered,
        )
        self._settle(exchange, tail, error, model)

    def _settle(self, exchange: Exchange, tail: bytes | None, error: BaseException | None, model: str | None) -> None:
        """A relayed answer's counts: the engine's failures, and the usage it reported."""
        if error is not None:
            kind = upstream_error_kind(error)
            self.metrics.upstream_errors.labels(kind).inc()
            log.warning("engine unreachable or broke off (%s): %s", kind, type(error).__name__)
        elif exchange.status >= 500 and not exchange.client_gone:
            self.metrics.upstream_errors.labels("status_5xx").inc()
        usage = usage_from_tail(tail) if tail is not None else None
        self.metrics.count_usage(usage)
        if model is not None:
            self.metrics.count_model(model, exchange.status, usage)

    async def _open(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes, first: FirstTry = None
    ) -> Response:
        """Send the request; the engine's response headers have arrived when this returns. `first`:
        what the express lane's try gave, if it was sent."""
        assert self.pool is not None, "the upstream pool opens in the app's lifespan"
        try:
            if isinstance(first, Response):
                return first
            if first is not None:
                raise first
            return await self.pool.request(method, target, headers, body)
        except (Disconnected, ConnectFailed):
            # Nearly always a pooled keep-alive connection the engine had just closed or reset (servers
            # close idle or errored connections at will; llama.cpp's closes after every stream while
            # advertising keep-alive), which the request never reached: once more, on a new
            # connection (the other idle ones may be as stale). An engine that is really gone then
            # refuses it, which answers 503.
            return await self.pool.request(method, target, headers, body, fresh=True)

    def _failure(self, exc: BaseException) -> errors.ErrorResponse:
        if isinstance(exc, asyncio.TimeoutError):
            return errors.upstream_timeout(self.settings.upstream_timeout_seconds)
        return errors.engine_unavailable(RETRY_AFTER_SECONDS)
