"""The gateway's per-request path: find the ModelServer the body's `model` names, hold the request
while it has no ready replica, pick a replica, and relay (the sidecar's own hot path, relay.py).

Keys are the sidecars' business: `Authorization` goes through as the client sent it and every
replica's sidecar checks it; the gateway never sees a Secret. But a request with no key at all for
a model not known to be public is answered 401 here, as a sidecar would: it could never pass, so it
is never held (nor counted as demand), and an unknown model answers the same, so that nobody learns
without a key which private models exist. Which keys a model's replicas let through is learned from
their answers (keys.Opened): at zero, a key seen opening the model is held with the verified
requests, any other in a small share of its own (holding.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from time import perf_counter
from typing import Any

import aiohttp

from modelserve.contracts import routes
from modelserve.contracts.names import Key
from modelserve.http import errors
from modelserve.http.direct import DirectDownstream
from modelserve.http.downstream import AsgiDownstream, Downstream, Exchange, Headers, answer
from modelserve.http.express import FirstTry, Forward, answer_now
from modelserve.http.json_body import BadJson, encode, parse
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.relay import (
    HOP_BY_HOP,
    authorization_header,
    filter_headers,
    read_limited_body,
    relay,
    upstream_error_kind,
)
from modelserve.http.upstream_pool import ConnectFailed, Disconnected, Pool, Response, UpstreamError

from . import errors as gateway_errors
from .directory import Ambiguous, Directory, Model, served_name
from .holding import Holding, Outcome
from .keys import Opened, client_bucket, digest, keyless, proof
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
# Each consumer route's one method, by its path.
_METHODS = {path: method for method, path in routes.CONSUMER_ROUTES}
KEYLESS = errors.unauthorized("missing")  # the sidecar's own answer to a request with no key


class _NoReplica(UpstreamError):
    """Every ready replica was tried (or none is left)."""


# A request's model, the body to send its replica and the prefix its affinity is keyed by.
Planned = tuple[Model, bytes, bytes | None]


class _Tries:
    """The replicas one request was sent to, and the one holding its in-flight count (address, pod)."""

    __slots__ = ("chosen", "tried")

    def __init__(self) -> None:
        self.tried: list[str] = []
        self.chosen: list[tuple[str, str]] = []

    def replica_header(self) -> list[tuple[bytes, bytes]]:
        chosen = self.chosen
        return [(REPLICA_HEADER, chosen[0][1].encode())] if chosen and chosen[0][1] else []


class GatewayProxy:
    def __init__(
        self,
        settings: GatewaySettings,
        directory: Directory,
        holding: Holding,
        metrics: GatewayMetrics,
        opened: Opened | None = None,
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.holding = holding
        self.metrics = metrics
        self.opened = opened or Opened()  # the keys seen opening each model, shared with the model lists
        self.pool: Pool | None = None  # the proxied requests' connections, opened by the app's lifespan
        self.session: aiohttp.ClientSession | None = None  # the model lists' (catalog.py), likewise
        self.in_flight: dict[str, int] = {}  # replica address -> requests this gateway has on it
        self.rng = random.Random()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI way in: Ollama's routes (their errors reworded), and any request the server's fast
        lane left to ASGI."""
        client = AsgiDownstream(receive, send)
        try:
            await self.serve(scope["path"], scope["headers"], client, (scope.get("client") or ("",))[0])
        finally:
            client.close()

    async def direct(self, request: DirectDownstream) -> None:
        """The server's fast lane (direct.py) for the OpenAI consumer routes."""
        await self.serve(request.path, request.headers, request, request.client_host)

    def admit(self, request: DirectDownstream) -> bool:
        """Nothing is decided from the head alone: the model is named in the body (direct.py)."""
        return False

    def express(self, request: DirectDownstream) -> bool:
        """The fast lane's first try (express.py): the same steps as `serve`, without awaiting, for a
        request whose body is in and whose model has a ready replica; the async way from where it
        cannot go on so (a retry, a stream)."""
        if request.body_size > self.settings.max_body_bytes or request.write_paused or self.pool is None:
            return False  # the 413 (and its closed connection), or a client not reading: the async way's
        exchange = Exchange(perf_counter())
        planned = self._plan(request.body(), request.headers)
        if isinstance(planned, errors.ErrorResponse):
            exchange.status = answer_now(request, planned)
            self._end(exchange, NO_MODEL)
            return True
        model, body, prefix = planned
        if not model.replicas:
            return False  # held until one is ready: the async way's (it reads the body again)
        key = model.key
        tries = _Tries()
        replica = self._try(model, prefix, tries, 0)
        assert replica is not None  # a model with replicas, none tried yet
        path = request.path
        headers = request.headers

        async def go_on(outcome: FirstTry) -> None:
            try:
                await self._forward(path, headers, request, body, model, prefix, exchange, tries, outcome)
            finally:
                self._end(exchange, key)

        def retried(response: Response) -> bool:
            self._learn(headers, model, response.status)
            return _retried(response, self.directory.models.get(key) or model, tries.tried)

        def end() -> None:
            self._leave(tries.chosen[0][0], key)
            self._end(exchange, key)

        forward = Forward(request, exchange, False, tries.replica_header, _nothing_to_settle, end, go_on, retried)
        to_replica = filter_headers(headers, DROP_TO_REPLICA)
        forward.send(self.pool, replica_method(path), f"http://{replica}{path}", to_replica, body)
        return True

    async def serve(self, path: str, headers: Headers, client: Downstream, peer: str | None = None) -> None:
        """`peer`: the client's address, which bounds what it may hold with keys not seen before."""
        exchange = Exchange(perf_counter())
        key = NO_MODEL
        try:
            key = await self._handle(path, headers, client, exchange, peer)
        finally:
            self._end(exchange, key)

    def _end(self, exchange: Exchange, key: Key) -> None:
        """Every request's count, however it ended."""
        label = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
        self.metrics.observe(key, label, perf_counter() - exchange.start, exchange.ttfb)

    async def _handle(
        self, path: str, headers: Headers, client: Downstream, exchange: Exchange, peer: str | None
    ) -> Key:
        body = await read_limited_body(headers, client, self.settings.max_body_bytes, exchange)
        if body is None:
            return NO_MODEL
        planned = self._plan(body, headers)
        if isinstance(planned, errors.ErrorResponse):
            exchange.status = await answer(client, planned)
            return NO_MODEL
        model, body, prefix = planned
        if not model.replicas:
            held = await self._hold(model, client, exchange, self._unverified_from(model, headers, peer))
            if held is None:
                return model.key
            model = held
        await self._forward(path, headers, client, body, model, prefix, exchange)
        return model.key

    def _plan(self, body: bytes, headers: Headers) -> Planned | errors.ErrorResponse:
        """The ModelServer the body names, the body for its replicas (named as they serve it) and the
        affinity prefix, or the error to answer with."""
        request, refusal = parse_request(body)
        if refusal is not None:
            return refusal
        requested = request["model"]
        try:
            model = self.directory.resolve(requested)
        except Ambiguous as ambiguous:
            if not ambiguous.public and keyless(authorization_header(headers)):
                return KEYLESS  # naming the namespaces would name a private model
            return gateway_errors.ambiguous_model(ambiguous.name, ambiguous.namespaces)
        if (model is None or not model.public) and keyless(authorization_header(headers)):
            return KEYLESS  # the same for an unknown model: which private ones exist stays unsaid
        if model is None:
            return gateway_errors.unknown_model(requested)
        served = served_name(requested)
        if requested != served:  # `namespace/name`: the replica serves it as `name`
            renamed = encode({**request, "model": served})
            if isinstance(renamed, BadJson):
                return errors.invalid_json(renamed.reason)
            body = renamed
        prefix = conversation_prefix(request) if self.settings.routing == PREFIX_AFFINITY else None
        if prefix is not None:
            prefix = affinity_key(prefix, served, model.name)
        return model, body, prefix

    def _unverified_from(self, model: Model, headers: Headers, peer: str | None) -> str | None:
        """The client a request is held for in the unverified share (holding.py): a private model's,
        with a key not seen opening it; None for one held with the verified requests."""
        if model.public:
            return None
        authorization = authorization_header(headers)
        if authorization is not None and self.opened.opens(digest(authorization), model.key):
            return None
        return client_bucket(peer)

    def _learn(self, headers: Headers, model: Model, status: int) -> None:
        """What a replica's answer says of the request's key for `model` (keys.proof)."""
        if model.public:
            return
        authorization = authorization_header(headers)
        if authorization is not None:
            self.opened.learn(digest(authorization), model.key, proof(status))

    async def _hold(
        self, model: Model, client: Downstream, exchange: Exchange, unverified_from: str | None = None
    ) -> Model | None:
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
            outcome = await self.holding.wait(key, remaining, client.gone(), unverified_from)
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
        elif outcome is Outcome.FULL and unverified_from is not None:
            settings = self.settings
            full = gateway_errors.unverified_hold_full(
                model.name, settings.max_held_unverified, settings.max_held_unverified_per_client
            )
            exchange.status = await answer(client, full)
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
        tries: _Tries | None = None,
        first: FirstTry = None,
    ) -> None:
        """Relay from a replica, retrying once on another; `tries` and `first`: the replica the express
        lane chose and sent to, and what that gave."""
        to_replica = filter_headers(headers, DROP_TO_REPLICA)
        # `path`: the consumer route the dispatcher checked, as it is spelt there; never the client's
        # raw path or query (allowlist.py).
        key = model.key
        tries = tries or _Tries()
        sent = tries.chosen[0][0] if tries.chosen else None

        async def open_upstream() -> Response:
            assert self.pool is not None, "the upstream pool opens in the app's lifespan"
            last: BaseException = _NoReplica(f"no ready replica of {model.name}")
            for attempt in range(2):
                current = self.directory.models.get(key) or model  # replicas may have changed while held
                replica = sent if attempt == 0 and sent else self._try(current, prefix, tries, attempt)
                if replica is None:
                    break
                try:
                    if attempt == 0 and sent and first is not None:
                        if not isinstance(first, Response):
                            raise first
                        response = first
                    else:
                        url = f"http://{replica}{path}"
                        response = await self.pool.request(replica_method(path), url, to_replica, body)
                    self._learn(headers, model, response.status)
                    if attempt or not _retried(response, current, tries.tried):
                        return response
                    response.release()
                    self._leave(replica, key)
                    tries.chosen.clear()
                    self.metrics.upstream_errors.labels(*key, "status_503").inc()
                    last = _NoReplica(f"{replica} answered 503")
                    continue
                except RETRIABLE as exc:
                    self._leave(replica, key)
                    tries.chosen.clear()
                    self.metrics.upstream_errors.labels(*key, upstream_error_kind(exc)).inc()
                    log.info("%s/%s: replica %s failed before answering (%s)", *key, replica, type(exc).__name__)
                    last = exc
            raise last

        try:
            _, error = await relay(client, exchange, open_upstream, self._failure, extra_headers=tries.replica_header)
            if error is not None and not isinstance(error, (*RETRIABLE, _NoReplica)):
                self.metrics.upstream_errors.labels(*key, upstream_error_kind(error)).inc()
        finally:
            if tries.chosen:
                self._leave(tries.chosen[0][0], key)

    def _try(self, model: Model, prefix: bytes | None, tries: _Tries, attempt: int) -> str | None:
        """Choose a replica not tried yet and count the request on it; None when none is left."""
        replica, decision = self._choose(model, prefix, tries.tried)
        if replica is None:
            return None
        key = model.key
        tries.tried.append(replica)
        self.metrics.routed(key, "retry" if attempt else decision)
        self._enter(replica, key)
        tries.chosen[:] = [(replica, model.pods.get(replica, ""))]
        return replica

    def _choose(self, model: Model, prefix: bytes | None, tried: list[str]) -> tuple[str | None, str]:
        if prefix is not None and model.ring is not None:
            replica, own = model.ring.pick(prefix, self.in_flight, self.settings.affinity_load_factor, tried)
            if replica is not None:
                return replica, "affinity" if own else "affinity_spill"
        return least_in_flight(model.replicas, self.in_flight, self.rng, tried), "least_in_flight"

    def _enter(self, replica: str, key: Key) -> None:
        self.in_flight[replica] = self.in_flight.get(replica, 0) + 1
        self.metrics.enter(key)

    def _leave(self, replica: str, key: Key) -> None:
        left = self.in_flight.get(replica, 1) - 1
        if left:
            self.in_flight[replica] = left
        else:
            self.in_flight.pop(replica, None)  # replicas come and go: keep no zero entries
        self.metrics.leave(key)

    def _failure(self, exc: BaseException) -> errors.ErrorResponse:
        if isinstance(exc, asyncio.TimeoutError):
            return errors.upstream_timeout(self.settings.upstream_timeout_seconds)
        return gateway_errors.replica_unavailable()


def _nothing_to_settle(tail: bytes | None, error: BaseException | None) -> None:
    """A complete answer on the express lane: the gateway counts no usage, and it had no error."""


def _retried(response: Response, model: Model, tried: list[str]) -> bool:
    """A first answer that another replica is asked instead: a sidecar's 503, with a replica untried."""
    return response.status == RETRIABLE_STATUS and any(replica not in tried for replica in model.replicas)


def parse_request(body: bytes) -> tuple[dict[str, Any], errors.ErrorResponse | None]:
    """The JSON request and its `model`, or the 400 to answer with (pure)."""
    request = parse(body)
    if isinstance(request, BadJson):
        return {}, errors.invalid_json(request.reason)
    if not isinstance(request, dict):
        return {}, errors.bad_request("Request body must be a JSON object.", "invalid_json")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        return {}, gateway_errors.missing_model()
    return request, None


def replica_method(path: str) -> str:
    """The method a replica is asked with: the consumer route's own (routes.py), as the client's
    was checked against it (POST for every route the gateway proxies today)."""
    return _METHODS[path]
