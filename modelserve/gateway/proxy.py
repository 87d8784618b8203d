"""The gateway's per-request path: find the ModelServer the body's `model` names, hold the request
while it has no ready replica, pick a replica, and relay (the sidecar's own hot path, relay.py).

Keys are the sidecars' business: `Authorization` goes through as the client sent it and every
replica's sidecar checks it; the gateway never sees a Secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from time import perf_counter
from typing import Any

import aiohttp

from modelserve.contracts.names import Key
from modelserve.http import errors
from modelserve.http.direct import DirectDownstream
from modelserve.http.downstream import AsgiDownstream, Downstream, Exchange, Headers, answer
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.relay import HOP_BY_HOP, filter_headers, read_limited_body, relay, upstream_error_kind
from modelserve.http.upstream_pool import ConnectFailed, Disconnected, Pool, Response, UpstreamError

from . import errors as gateway_errors
from .directory import Ambiguous, Directory, Model, served_name
from .holding import Holding, Outcome
from .metrics import GatewayMetrics
from .routing import affinity_key, conversation_prefix, least_in_flight
from .settings import PREFIX_AFFINITY, GatewaySettings

log = logging.getLogger(__name__)

# Authorization stays: the replica's sidecar checks the key.
DROP_TO_REPLICA = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
REPLICA_HEADER = b"x-modelserve-replica"  # which pod answered: for debugging and the tests
# A failure to reach the first replica is retried once, on another, when it happened before any
# byte reached the client: the connection was refused, reset or dropped before the response headers.
RETRIABLE = (ConnectFailed, Disconnected)
# A sidecar's 503 (its engine unreachable, or draining) before any byte: another replica may answer.
RETRIABLE_STATUS = 503
NO_MODEL: Key = ("", "")


class _NoReplica(UpstreamError):
    """Every ready replica was tried (or none is left)."""


class GatewayProxy:
    def __init__(
        self, settings: GatewaySettings, directory: Directory, holding: Holding, metrics: GatewayMetrics
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.holding = holding
        self.metrics = metrics
        self.pool: Pool | None = None  # the proxied requests' connections, opened by the app's lifespan
        self.session: aiohttp.ClientSession | None = None  # the model lists' (catalog.py), likewise
        self.in_flight: dict[str, int] = {}  # replica address -> requests this gateway has on it
        self.rng = random.Random()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI way in: Ollama's routes (their errors reworded), and any request the server's fast
        lane left to ASGI."""
        client = AsgiDownstream(receive, send)
        try:
            await self.serve(scope["path"], scope["headers"], client)
        finally:
            client.close()

    async def direct(self, request: DirectDownstream) -> None:
        """The server's fast lane (direct.py) for the OpenAI consumer routes."""
        await self.serve(request.path, request.headers, request)

    async def serve(self, path: str, headers: Headers, client: Downstream) -> None:
        exchange = Exchange(perf_counter())
        key = NO_MODEL
        try:
            key = await self._handle(path, headers, client, exchange)
        finally:
            label = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
            self.metrics.observe(key, label, perf_counter() - exchange.start, exchange.ttfb)

    async def _handle(self, path: str, headers: Headers, client: Downstream, exchange: Exchange) -> Key:
        body = await read_limited_body(headers, client, self.settings.max_body_bytes, exchange)
        if body is None:
            return NO_MODEL

        request, refusal = parse_request(body)
        if refusal is not None:
            exchange.status = await answer(client, refusal)
            return NO_MODEL
        requested = request["model"]
        try:
            model = self.directory.resolve(requested)
        except Ambiguous as ambiguous:
            exchange.status = await answer(client, gateway_errors.ambiguous_model(ambiguous.name, ambiguous.namespaces))
            return NO_MODEL
        if model is None:
            exchange.status = await answer(client, gateway_errors.unknown_model(requested))
            return NO_MODEL
        served = served_name(requested)
        if requested != served:  # `namespace/name`: the replica serves it as `name`
            body = json.dumps({**request, "model": served}).encode()

        if not model.replicas:
            held = await self._hold(model, client, exchange)
            if held is None:
                return model.key
            model = held
        prefix = conversation_prefix(request) if self.settings.routing == PREFIX_AFFINITY else None
        if prefix is not None:
            prefix = affinity_key(prefix, served, model.name)
        await self._forward(path, headers, client, body, model, prefix, exchange)
        return model.key

    async def _hold(self, model: Model, client: Downstream, exchange: Exchange) -> Model | None:
        """Wait for a ready replica of `model`; None when the request was answered (or gone) here."""
        key = model.key
        deadline = exchange.start + self.settings.hold_seconds
        outcome = Outcome.TIMEOUT
        current: Model | None = model
        while current is not None and not current.replicas:
            remaining = deadline - perf_counter()
            if remaining <= 0:
                outcome = Outcome.TIMEOUT
                break
            outcome = await self.holding.wait(key, remaining, client.gone())
            current = self.directory.models.get(key)
            if outcome is not Outcome.READY:
                break
        waited = perf_counter() - exchange.start
        if current is not None and current.replicas:
            self.metrics.hold.labels(*key, Outcome.READY.value).observe(waited)
            return current
        self.metrics.hold.labels(*key, outcome.value).observe(waited)
        if current is None:
            exchange.status = await answer(client, gateway_errors.unknown_model(model.name))
        elif outcome is Outcome.GONE:
            exchange.client_gone = True
        elif outcome is Outcome.FULL:
            exchange.status = await answer(client, gateway_errors.hold_queue_full(model.name, self.settings.max_held))
        else:
            exchange.status = await answer(client, gateway_errors.hold_timeout(model.name, self.settings.hold_seconds))
        return None

    async def _forward(
        self,
        path: str,
        headers: Headers,
        client: Downstream,
        body: bytes,
        model: Model,
        prefix: bytes | None,
        exchange: Exchange,
    ) -> None:
        to_replica = filter_headers(headers, DROP_TO_REPLICA)
        # `path`: the consumer route the dispatcher checked, as it is spelt there; never the client's
        # raw path or query (allowlist.py).
        key = model.key
        tried: list[str] = []
        chosen: list[tuple[str, str]] = []  # (address, pod): the replica holding this request's count

        async def open_upstream() -> Response:
            assert self.pool is not None, "the upstream pool opens in the app's lifespan"
            last: BaseException = _NoReplica(f"no ready replica of {model.name}")
            for attempt in range(2):
                current = self.directory.models.get(key) or model  # replicas may have changed while held
                replica, decision = self._choose(current, prefix, tried)
                if replica is None:
                    break
                tried.append(replica)
                self.metrics.routed(key, "retry" if attempt else decision)
                self._enter(replica, key)
                chosen[:] = [(replica, current.pods.get(replica, ""))]
                try:
                    response = await self.pool.request("POST", f"http://{replica}{path}", to_replica, body)
                    if response.status != RETRIABLE_STATUS or attempt or not _others(current, tried):
                        return response
                    response.release()
                    self._leave(replica, key)
                    chosen.clear()
                    self.metrics.upstream_errors.labels(*key, "status_503").inc()
                    last = _NoReplica(f"{replica} answered 503")
                    continue
                except RETRIABLE as exc:
                    self._leave(replica, key)
                    chosen.clear()
                    self.metrics.upstream_errors.labels(*key, upstream_error_kind(exc)).inc()
                    log.info("%s/%s: replica %s failed before answering (%s)", *key, replica, type(exc).__name__)
                    last = exc
            raise last

        def replica_header() -> list[tuple[bytes, bytes]]:
            return [(REPLICA_HEADER, chosen[0][1].encode())] if chosen and chosen[0][1] else []

        try:
            _, error = await relay(client, exchange, open_upstream, self._failure, extra_headers=replica_header)
            if error is not None and not isinstance(error, (*RETRIABLE, _NoReplica)):
                self.metrics.upstream_errors.labels(*key, upstream_error_kind(error)).inc()
        finally:
            if chosen:
                self._leave(chosen[0][0], key)

    def _choose(self, model: Model, prefix: bytes | None, tried: list[str]) -> tuple[str | None, str]:
        if prefix is not None and model.ring is not None:
            replica, own = model.ring.pick(prefix, self.in_flight, self.settings.affinity_load_factor, tried)
            if replica is not None:
                return replica, "affinity" if own else "affinity_spill"
        return least_in_flight(model.replicas, self.in_flight, self.rng, tried), "least_in_flight"

    def _enter(self, replica: str, key: Key) -> None:
        self.in_flight[replica] = self.in_flight.get(replica, 0) + 1
        self.metrics.in_flight_of(key).inc()

    def _leave(self, replica: str, key: Key) -> None:
        left = self.in_flight.get(replica, 1) - 1
        if left:
            self.in_flight[replica] = left
        else:
            self.in_flight.pop(replica, None)  # replicas come and go: keep no zero entries
        self.metrics.in_flight_of(key).dec()

    def _failure(self, exc: BaseException) -> errors.ErrorResponse:
        if isinstance(exc, asyncio.TimeoutError):
            return errors.upstream_timeout(self.settings.upstream_timeout_seconds)
        return gateway_errors.replica_unavailable()


def _others(model: Model, tried: list[str]) -> bool:
    return any(replica not in tried for replica in model.replicas)


def parse_request(body: bytes) -> tuple[dict[str, Any], errors.ErrorResponse | None]:
    """The JSON request and its `model`, or the 400 to answer with (pure)."""
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return {}, errors.bad_request(f"Request body is not valid JSON: {exc}", "invalid_json")
    if not isinstance(request, dict):
        return {}, errors.bad_request("Request body must be a JSON object.", "invalid_json")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        return {}, gateway_errors.missing_model()
    return request, None
