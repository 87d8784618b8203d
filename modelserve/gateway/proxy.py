"""The gateway's steps of the request pipeline (http/pipeline.py, shared with the sidecar): find the
ModelServer the body's `model` names (plan), hold the request while it has no ready replica (wait),
pick a replica, and relay; a first try that fails is tried once on another replica.

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
from collections.abc import Hashable
from time import perf_counter
from typing import Any

import aiohttp

from modelserve.contracts import routes
from modelserve.contracts.names import Key
from modelserve.contracts.pod_urls import url_of
from modelserve.http import errors, off_loop
from modelserve.http.downstream import Downstream, Exchange, Headers, answer
from modelserve.http.limits import client_bucket
from modelserve.http.loop_share import LoopShare
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.off_loop import OffLoop
from modelserve.http.pipeline import RETRIABLE, NoUpstream, PassedOn, Pipeline, Plan, Upstream
from modelserve.http.relay import HOP_BY_HOP, authorization_header, filter_headers, upstream_error_kind
from modelserve.http.upstream_pool import Response

from . import errors as gateway_errors
from . import request_read, versions
from .directory import Ambiguous, Directory, Model, endpoint_of, served_name
from .held_streams import KeepAlive, StartedStream, comment
from .holding import Holding, Outcome
from .keys import Opened, digest, keyless, proof
from .metrics import GatewayMetrics
from .request_read import RequestRead, parse_request, with_model
from .routing import affinity_key, conversation_prefix, least_in_flight
from .settings import PREFIX_AFFINITY, GatewaySettings

log = logging.getLogger(__name__)

# Authorization stays: the replica's sidecar checks the key.
DROP_TO_REPLICA = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
REPLICA_HEADER = b"x-modelserve-replica"  # which pod answered: for debugging and the tests
# A sidecar's 503 (its engine unreachable, or draining) before any byte: another replica may answer.
RETRIABLE_STATUS = 503
NO_MODEL: Key = ("", "")
# The routes whose `"stream": true` answers are OpenAI's SSE streams: kept alive while held.
SSE_ROUTES = frozenset({routes.CHAT, routes.COMPLETIONS})
# Bodies read off the event loop at once (http/off_loop.py): one helper process per gateway process
# reads them one at a time; more than this many waiting for it are refused, and more than
# OFF_LOOP_PER_OWNER of one owner's (a proven key, else a client address: `_reader_share`).
OFF_LOOP_PENDING = 8
OFF_LOOP_PER_OWNER = 1
KEYLESS = errors.unauthorized("missing")  # the sidecar's own answer to a request with no key


class ReplicaPlan(Plan):
    """A request for one of a ModelServer's replicas: the model (as it is now, once held), the prefix
    its affinity is keyed by, the client's Authorization, and the replicas tried, the one held now
    and its pod."""

    __slots__ = (
        "authorization",
        "held",
        "model",
        "pod",
        "prefix",
        "rename_to",
        "replica",
        "sse",
        "subset",
        "tried",
        "versions",
    )

    def __init__(
        self,
        route: routes.Route,
        body: bytes,
        headers: Headers,
        model: Model,
        prefix: bytes | None,
        authorization: bytes | None,
    ) -> None:
        super().__init__(route, body, headers, False)  # usage is the sidecars' to count
        self.model = model
        self.prefix = prefix
        self.authorization = authorization
        self.tried: list[str] = []
        self.replica: str | None = None
        self.pod = ""
        self.versions: tuple[Model, ...] = ()  # every version of its served name, when it has versions
        self.sse = False  # an OpenAI stream (SSE_ROUTES, `"stream": true`): kept alive while held
        self.held = 0.0  # seconds held waiting for a replica: not the version's own time to answer
        # A body read off the loop whose model the replica knows by another name: renamed off the loop
        # too, in `wait`, before it is sent.
        self.rename_to: str | None = None
        # The endpoints (`podIP:port`) a replica must be picked from: the endpoint picker's subset hint
        # from its data plane (picker.py). None: any of the model's replicas.
        self.subset: frozenset[str] | None = None

    def answer_headers(self) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        return [(REPLICA_HEADER, self.pod.encode())] if self.pod else []


class GatewayProxy(Pipeline):
    """The gateway's steps: plan (the model named, renamed as the replica serves it), wait (held
    while it has no ready replica), pick (a replica: affinity or least in flight), passes_on (a
    sidecar's 503), settle (upstream errors), end (the request's metrics, by model)."""

    def __init__(
        self,
        settings: GatewaySettings,
        directory: Directory,
        holding: Holding,
        metrics: GatewayMetrics,
        opened: Opened | None = None,
    ) -> None:
        super().__init__(routes.CONSUMER_ROUTES, settings.max_body_bytes)
        self.settings = settings
        self.directory = directory
        self.holding = holding
        self.metrics = metrics
        metrics.lifecycle(self.ledger)
        self.opened = opened or Opened()  # the keys seen opening each model, shared with the model lists
        self.session: aiohttp.ClientSession | None = None  # the model lists' (catalog.py), opened by the lifespan
        self.in_flight: dict[str, int] = {}  # replica address -> requests this gateway has on it
        self.guards = versions.Guards()  # the versions' answers, and the guards they tripped
        self.off_loop_work = OffLoop(OFF_LOOP_PENDING, per_owner=OFF_LOOP_PER_OWNER)  # bodies too large for the loop
        self.loop_share = LoopShare(settings.loop_share_values_per_second)
        self.rng = random.Random()

    # --- the pipeline's steps ---------------------------------------------------------------------

    def plan(
        self, route: routes.Route, headers: Headers, body: bytes, exchange: Exchange
    ) -> ReplicaPlan | errors.ErrorResponse:
        """The ModelServer the body names, the body for its replicas (named as they serve it) and the
        affinity prefix, or the error to answer with. The body is read here, or was read off the event
        loop (`exchange.read`: `read`)."""
        read: RequestRead | None = exchange.read
        request = None
        if read is None:
            request, refusal = parse_request(body)
            if refusal is not None:
                return refusal
            requested, stream = request["model"], request.get("stream") is True
        else:
            requested, stream = read.model, read.stream
        authorization = authorization_header(headers)
        try:
            named = self.directory.versions(requested)
        except Ambiguous as ambiguous:
            if not ambiguous.public and keyless(authorization):
                return KEYLESS  # naming the namespaces would name a private model
            return gateway_errors.ambiguous_model(ambiguous.name, ambiguous.namespaces)
        if (not named or not all(m.public for m in named)) and keyless(authorization):
            return KEYLESS  # the same for an unknown model: which private ones exist stays unsaid
        if not named:
            return gateway_errors.unknown_model(requested)
        affinity = self.settings.routing == PREFIX_AFFINITY
        conversation = None
        if affinity or len(named) > 1:
            conversation = conversation_prefix(request) if request is not None else read.conversation  # type: ignore[union-attr]
        model = named[0]
        if len(named) > 1:  # versions of one served name: by weight, one conversation on one version
            chosen = versions.choose([m for m in named if not self.guards.tripped(m)], conversation, self.rng)
            if chosen is None:
                return gateway_errors.no_version(served_name(requested))
            model = chosen
        served = served_name(requested)
        # The replica serves its ModelServer's own name; an adapter's name stays as it is.
        as_replica = model.name if served == model.served else served
        rename_to = None
        if requested != as_replica:  # `namespace/name`, or a served name of versions
            if request is None:
                rename_to = as_replica
            else:
                renamed = with_model(request, as_replica)
                if isinstance(renamed, errors.ErrorResponse):
                    return renamed
                body = renamed
        prefix = None if conversation is None or not affinity else affinity_key(conversation, served, model.served)
        plan = ReplicaPlan(route, body, filter_headers(headers, DROP_TO_REPLICA), model, prefix, authorization)
        plan.versions = named if len(named) > 1 or model.guard is not None else ()
        plan.sse = route in SSE_ROUTES and stream
        plan.rename_to = rename_to
        return plan

    def admit(self, method: str, headers: Headers) -> errors.ErrorResponse | None:
        """From the head: a POST without a key while no ModelServer here is public can only get its
        sidecar's 401, so it gets it now, before any byte of its body is held or read."""
        if method == "POST" and not self.directory.public and keyless(authorization_header(headers)):
            return KEYLESS
        return None

    def _off_loop_refusal(self, result: Any) -> errors.ErrorResponse | None:
        return off_loop.refusal(result, "gateway", self.off_loop_work.memory_bytes)

    def _reader_share(self, authorization: bytes | None, peer: str | None) -> tuple[str, object]:
        """Whose places in the body reader a request takes: a key a replica accepted has its own; any
        other request (keyless, or a key never proven) its client address's, however many keys it makes up."""
        key = None if authorization is None else digest(authorization)
        if key is not None and self.opened.opens_some(key):
            return ("key", key)
        return ("client", client_bucket(peer))

    def owner(self, headers: Headers, peer: str | None, admitted: Any) -> tuple[str, object]:
        return self._reader_share(authorization_header(headers), peer)

    async def read(self, route: routes.Route, body: bytes, owner: Hashable) -> RequestRead | errors.ErrorResponse:
        """The summary of a body of very many JSON values (or past its owner's share of the loop),
        read in the off-loop process."""
        summary = await self.off_loop_work.run(request_read.read, body, owner=owner)
        self.metrics.read_off_loop.labels(off_loop.outcome(summary)).inc()
        return self._off_loop_refusal(summary) or summary

    def ready(self, plan: ReplicaPlan) -> bool:  # type: ignore[override]
        return plan.rename_to is None and bool(plan.model.replicas)

    async def wait(self, plan: ReplicaPlan, client: Downstream, exchange: Exchange, peer: str | None) -> bool:  # type: ignore[override]
        """Hold the request until `plan.model` has a ready replica (the model as it is then); False
        when it was answered here (or its client is gone). A held OpenAI stream gets keep-alives
        meanwhile (held_streams.py); once they started its answer, the rest goes through it. First, a
        body read off the loop that needs another model name is renamed there too."""
        if plan.rename_to is not None:
            owner = self._reader_share(plan.authorization, peer)
            renamed = await self.off_loop_work.run(request_read.renamed, plan.body, plan.rename_to, owner=owner)
            if not isinstance(renamed, bytes):
                exchange.status = await answer(client, self._off_loop_refusal(renamed) or renamed)
                return False
            plan.body, plan.rename_to = renamed, None
            if plan.model.replicas:
                return True
        model = plan.model
        key = model.key
        unverified_from = self._unverified_from(plan, peer)
        deadline = exchange.start + self.settings.hold_seconds
        outcome = Outcome.TIMEOUT
        current: Model | None = model
        keep_alive = self._keep_alive(plan, client, exchange)
        try:
            while current is not None and not current.replicas:
                remaining = deadline - perf_counter()
                if remaining <= 0:
                    outcome = Outcome.TIMEOUT
                    break
                outcome = await self.holding.wait(key, remaining, client.gone(), unverified_from)
                current = self.directory.models.get(key)
                if outcome is not Outcome.READY:
                    break
        except BaseException:
            if keep_alive is not None:
                keep_alive.cancel()
            raise
        if keep_alive is not None and await keep_alive.stop():
            client = plan.answer_to = StartedStream(client)
        waited = perf_counter() - exchange.start
        plan.held = waited
        if current is not None and current.replicas:
            self.metrics.hold.labels(*key, Outcome.READY.value).observe(waited)
            plan.model = current
            return True
        self.metrics.hold.labels(*key, outcome.value).observe(waited)
        if current is None:
            exchange.status = await answer(client, gateway_errors.unknown_model(model.name))
        elif outcome is Outcome.GONE:
            exchange.client_gone = True
        elif outcome is Outcome.FULL and unverified_from is not None:
            settings = self.settings
            full = gateway_errors.unverified_hold_full(
                model.name,
                settings.max_held_unverified,
                settings.max_held_unverified_per_client,
                self.holding.retry_after(key, gateway_errors.FULL_RETRY_AFTER_SECONDS, model.last_start),
            )
            exchange.status = await answer(client, full)
        elif outcome is Outcome.FULL:
            retry = self.holding.retry_after(key, gateway_errors.FULL_RETRY_AFTER_SECONDS, model.last_start)
            full = gateway_errors.hold_queue_full(model.name, self.settings.max_held, retry)
            exchange.status = await answer(client, full)
        else:
            retry = self.holding.retry_after(key, gateway_errors.HOLD_RETRY_AFTER_SECONDS, model.last_start)
            timeout = gateway_errors.hold_timeout(model.name, self.settings.hold_seconds, retry)
            exchange.status = await answer(client, timeout)
        return False

    def pick(self, plan: ReplicaPlan, attempt: int) -> Upstream | None:  # type: ignore[override]
        """A replica not tried yet (and in `plan.subset`, when it has one), counted on it; None when none
        is left. The model's replicas as they are now: they may have changed since the request was
        planned (or held)."""
        key = plan.model.key
        model = self.directory.models.get(key) or plan.model
        excluded = plan.tried
        if plan.subset is not None:
            excluded = [*plan.tried, *(r for r in model.replicas if endpoint_of(r) not in plan.subset)]
        replica, decision = self._choose(model, plan.prefix, excluded)
        if replica is None:
            return None
        plan.tried.append(replica)
        self.metrics.routed(key, "retry" if attempt else decision)
        self.in_flight[replica] = self.in_flight.get(replica, 0) + 1
        self.metrics.enter(key)
        plan.replica = replica
        plan.pod = model.pods.get(replica, "")
        # `route.path`: the consumer route the dispatcher checked, as it is spelt there; never the
        # client's raw path or query (allowlist.py).
        return url_of(replica, plan.route.path), False

    def release(self, plan: ReplicaPlan) -> None:  # type: ignore[override]
        replica = plan.replica
        assert replica is not None
        left = self.in_flight.get(replica, 1) - 1
        if left:
            self.in_flight[replica] = left
        else:
            self.in_flight.pop(replica, None)  # replicas come and go: keep no zero entries
        self.metrics.leave(plan.model.key)
        plan.replica = None
        plan.pod = ""

    def passes_on(self, plan: ReplicaPlan, response: Response, attempt: int) -> bool:  # type: ignore[override]
        """What the answer says of the request's key is learnt; a first answer that is a sidecar's
        503 is given up for another replica's, if one is left untried."""
        self.learn(plan, response.status)
        if attempt or response.status != RETRIABLE_STATUS:
            return False
        model = self.directory.models.get(plan.model.key) or plan.model
        return any(replica not in plan.tried for replica in model.replicas)

    def tried(self, plan: ReplicaPlan, error: BaseException) -> None:  # type: ignore[override]
        key = plan.model.key
        if isinstance(error, PassedOn):
            self.metrics.upstream_errors.labels(*key, "status_503").inc()
            return
        self.metrics.upstream_errors.labels(*key, upstream_error_kind(error)).inc()
        log.info("%s/%s: replica %s failed before answering (%s)", *key, plan.tried[-1], type(error).__name__)

    def settle(self, plan: ReplicaPlan, exchange: Exchange, tail: bytes | None, error: BaseException | None) -> None:  # type: ignore[override]
        """An error not counted per try already (a timeout, or an answer cut)."""
        if error is not None and not isinstance(error, (*RETRIABLE, NoUpstream)):
            self.metrics.upstream_errors.labels(*plan.model.key, upstream_error_kind(error)).inc()

    def end(self, exchange: Exchange) -> None:
        plan = exchange.plan
        key = plan.model.key if plan is not None else NO_MODEL
        label = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
        self.metrics.observe(key, label, perf_counter() - exchange.start, exchange.ttfb)
        if plan is not None and plan.versions and plan.tried and not exchange.client_gone:
            self.judge(plan, exchange.status, exchange.ttfb)

    def failure(self, error: BaseException) -> errors.ErrorResponse:
        if isinstance(error, asyncio.TimeoutError):
            return errors.upstream_timeout(self.settings.upstream_timeout_seconds)
        return gateway_errors.replica_unavailable()

    # --- their parts --------------------------------------------------------------------------------

    def _keep_alive(self, plan: ReplicaPlan, client: Downstream, exchange: Exchange) -> KeepAlive | None:
        """A held OpenAI stream's keep-alives (held_streams.py); None for any other request."""
        interval = self.settings.hold_keepalive_seconds
        if not plan.sse or not interval:
            return None
        key, name, expected = plan.model.key, plan.model.name, plan.model.last_start
        counter = self.metrics.keepalives.labels(*key)
        return KeepAlive(
            client, interval, lambda: comment(name, perf_counter() - exchange.start, expected), counter.inc
        )

    def judge(self, plan: ReplicaPlan, status: int, ttfb: float | None) -> None:
        """A version's answer (its status, and its first byte's time since the request came, None
        with no answer), for its guard (versions.py): failed at 5xx or with no answer. The proxy's
        own requests and the endpoint picker's (picker.py: the data plane's answer) both."""
        failed = status >= 500 or ttfb is None
        ttfb = None if ttfb is None else max(0.0, ttfb - plan.held)
        report = self.guards.record(plan.model, plan.versions, ttfb, failed)
        if report is not None:
            log.warning("%s/%s: traffic guard tripped, no new requests: %s", *plan.model.key, report.message)
            self.metrics.guard_trips.labels(*plan.model.key).inc()

    def _unverified_from(self, plan: ReplicaPlan, peer: str | None) -> str | None:
        """The client a request is held for in the unverified share (holding.py): a private model's,
        with a key not seen opening it; None for one held with the verified requests."""
        if plan.model.public:
            return None
        authorization = plan.authorization
        if authorization is not None and self.opened.opens(digest(authorization), plan.model.key):
            return None
        return client_bucket(peer)

    def learn(self, plan: ReplicaPlan, status: int) -> None:
        """What a replica's answer says of the request's key for its model (keys.proof)."""
        if not plan.model.public and plan.authorization is not None:
            self.opened.learn(digest(plan.authorization), plan.model.key, proof(status))

    def _choose(self, model: Model, prefix: bytes | None, tried: list[str]) -> tuple[str | None, str]:
        if prefix is not None and model.ring is not None:
            replica, own = model.ring.pick(prefix, self.in_flight, self.settings.affinity_load_factor, tried)
            if replica is not None:
                return replica, "affinity" if own else "affinity_spill"
        return least_in_flight(model.replicas, self.in_flight, self.rng, tried), "least_in_flight"
