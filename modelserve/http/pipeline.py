"""One request pipeline for both proxies (the sidecar and the gateway) and all their lanes.

A proxied request goes through these steps, in this order. Each proxy supplies its own steps by
overriding the methods of the same names on `Pipeline`; the pipeline runs them, once, for every lane:
the ASGI way and the direct protocol's task (`serve`), and the express lane (`express`, express.py).

    admit    from the head alone, before the body is read: the key and its limits (a refusal, or what
             the request is let in with, which `end` gives back: no body is held for a request that
             its key's limits refuse)
    read     only for a body whose reading would stall the event loop (more than
             json_body.MANY_VALUES values), or would take its owner past its share of the loop
             (`loop_share`, http/loop_share.py): read off the loop first, for `plan` (JSON of
             millions of values, http/off_loop.py)
    plan     from the body: its route's checks and rewrites -> a `Plan` (what to send), or a refusal
    wait     until the plan can be sent (`ready`): the gateway holds a model with no ready replica
             (and may start the answer meanwhile, a held stream's keep-alives: then the rest
             answers through `plan.answer_to`)
    pick     the upstream of one try (the sidecar's engine, the gateway's replica), counted on it;
             `release` gives it back
    forward  send, and relay the answer; a first try that failed before any byte reached the client
             (refused, reset, dropped, or an answer `passes_on` gives up) is tried once more, on the
             upstream `pick` gives then; `tried` counts each failed try
    settle   a relayed answer's accounting: usage from its tail, upstream errors
    end      every request's accounting (its metrics), however it ended

The allowlist runs before all of these, in each proxy's dispatcher and in the direct protocol's route
table (allowlist.py): the pipeline sees consumer routes only, and looks each up in its route table
again (a refused key answers before a route is looked up, as before any other check).

The lifecycle rules. They are what keeps a hand-written HTTP stack correct; `Ledger` counts them, the
proxies export the counts, and the tests check them after their traffic (harness/lifecycle.py):

1. One owner at a time. A request is the protocol's (direct.py) until its body is in; then the express
   lane's (`Forward`, from the connections' callbacks); then a task's (the async way), each handing it
   over by a call that ends its own part. The ASGI way is a task's from the start.
2. Every request that begins ends exactly once, whichever lane it took and however it went (answered,
   refused, cut, its client gone, the drain deadline): in flight +1 at `_begin`, -1 at `_end`; idle,
   nothing is in flight.
3. Every pick is released exactly once: when its try failed, or when the request's forward is over.
4. A relayed answer is settled once, before its request ends.
5. What is sent upstream is the route's own method and path (routes.py), never the client's spelling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from time import perf_counter
from typing import Any, ClassVar

from modelserve.contracts import routes

from . import errors
from .direct import DirectDownstream
from .downstream import AsgiDownstream, Downstream, Exchange, Headers, answer
from .express import FirstTry, Forward, answer_now
from .json_body import MANY_VALUES, value_count
from .loop_share import LoopShare
from .relay import read_limited_body, relay
from .upstream_pool import ConnectFailed, Disconnected, Pool, Response, UpstreamError

log = logging.getLogger(__name__)

# A failed try that is tried once more: the connection was refused, reset or dropped before the
# response headers (nearly always a pooled keep-alive connection the upstream had just closed, which
# the request never reached).
RETRIABLE = (ConnectFailed, Disconnected)
# Set in the ASGI scope by an adapter that rewrote the request's path (the sidecar's Ollama adapter):
# the route the client called, which the metrics label instead of the engine's path.
ROUTE_SCOPE_KEY = "modelserve.route"
# The rules `Ledger` can see broken (rule 2's "never" shows as requests left in flight).
ENDED_TWICE = "ended_twice"
SETTLED_TWICE = "settled_twice"
PICKED_WHILE_HELD = "picked_while_held"

# One try's upstream: its URL, and whether it is asked on a new connection rather than an idle one.
Upstream = tuple[str, bool]
NOT_YET = object()  # a request not admitted from its head yet (`serve` admits it)


class NoUpstream(UpstreamError):
    """No upstream is left to try."""


class PassedOn(NoUpstream):
    """A first answer given up for another upstream's (`passes_on`: the gateway's replica's 503)."""


class Plan:
    """What a checked request becomes: its route's method and path, sent to the upstream `pick` gives
    with `body` and `headers`. A proxy's plan adds what its own steps need."""

    __slots__ = ("answer_to", "body", "headers", "metered", "route", "settled", "upstream")
    # Headers added to the answer, known once the upstream is chosen (the gateway's replica); None: none.
    answer_headers: ClassVar[Callable[[], Iterable[tuple[bytes, bytes]]] | None] = None

    def __init__(self, route: routes.Route, body: bytes, headers: Headers, metered: bool) -> None:
        self.route = route
        self.body = body
        self.headers = headers
        self.metered = metered  # its answer's usage is counted (settle gets its tail)
        self.upstream: Upstream | None = None  # the pick held now
        self.settled = False
        # Set by `wait` when it started the answer: the client the rest is answered through.
        self.answer_to: Downstream | None = None


class Ledger:
    """The pipeline's count of its requests and picks, and of the lifecycle rules it saw broken."""

    __slots__ = ("begun", "broken", "ended", "picked", "released")

    def __init__(self) -> None:
        self.begun = self.ended = self.picked = self.released = 0
        self.broken: dict[str, int] = {}

    @property
    def in_flight(self) -> int:
        return self.begun - self.ended

    @property
    def held(self) -> int:
        return self.picked - self.released

    def broke(self, rule: str) -> None:
        self.broken[rule] = self.broken.get(rule, 0) + 1
        log.error("request lifecycle rule broken: %s", rule)


class Pipeline:
    """The lanes, running one proxy's steps (a subclass: the sidecar's Proxy, the gateway's)."""

    def __init__(self, table: Mapping[tuple[str, str], routes.Route], max_body_bytes: int) -> None:
        self.table = table  # the routes this proxy forwards, by (method, path)
        self.max_body_bytes = max_body_bytes
        self.ledger = Ledger()
        self.pool: Pool | None = None  # opened by the app's lifespan
        # Each owner's share of the loop for reading bodies: a proxy that reads off the loop (`read`)
        # sets it; without it every body is read on the loop.
        self.loop_share: LoopShare | None = None

    # --- the steps: each proxy's own ----------------------------------------------------------------

    def admit(self, method: str, headers: Headers) -> Any:
        """From the head alone: a refusal (an `errors.ErrorResponse`, counted), or anything else to go
        on: what the request is let in with (None: nothing), kept as `exchange.admitted` for `plan` and
        `end`, which gives back what it holds."""
        return None

    def owner(self, headers: Headers, peer: str | None, admitted: Any) -> Hashable:
        """Whose share of the loop and of the off-loop places a request's body takes (`peer`: the
        client's address; `admitted`: what `admit` let it in with, or NOT_YET)."""
        return None

    async def read(self, route: routes.Route, body: bytes, owner: Hashable) -> Any:
        """`body` read off the event loop (`reads_off_loop`): what `plan` finds in `exchange.read`, or an
        `errors.ErrorResponse` to answer. `owner`: whose places it takes."""
        raise NotImplementedError

    def plan(
        self, route: routes.Route, headers: Headers, body: bytes, exchange: Exchange
    ) -> Plan | errors.ErrorResponse:
        """From the body and what the exchange holds of the request (`admitted`, `read`)."""
        raise NotImplementedError

    def ready(self, plan: Plan) -> bool:
        """The plan can be sent now (else `wait` first)."""
        return True

    async def wait(self, plan: Plan, client: Downstream, exchange: Exchange, peer: str | None) -> bool:
        """Until the plan can be sent: True to go on, False when the request was answered (or gone)."""
        return True

    def pick(self, plan: Plan, attempt: int) -> Upstream | None:
        """The upstream of try `attempt` (0 or 1), counted on it; None when none is left."""
        raise NotImplementedError

    def release(self, plan: Plan) -> None:
        """Give back what `pick` counted (`plan.upstream`, cleared after this)."""

    def passes_on(self, plan: Plan, response: Response, attempt: int) -> bool:
        """An answer the request gives up for another upstream's (only a first one is given up)."""
        return False

    def tried(self, plan: Plan, error: BaseException) -> None:
        """A failed try's accounting (it is tried once more if it was the first)."""

    def settle(self, plan: Plan, exchange: Exchange, tail: bytes | None, error: BaseException | None) -> None:
        """A relayed answer's accounting: `tail`, its end when the plan is metered; `error`, the
        upstream's failure if it had one."""

    def end(self, exchange: Exchange) -> None:
        """Every request's accounting, however it ended."""

    def failure(self, error: BaseException) -> errors.ErrorResponse:
        """The answer to a request no upstream answered."""
        raise NotImplementedError

    # --- the lanes ----------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI way in: Ollama's routes, and any request the server's fast lane left to ASGI."""
        client = AsgiDownstream(receive, send)
        try:
            label = scope.get(ROUTE_SCOPE_KEY) or scope["path"]
            peer = (scope.get("client") or ("",))[0]
            await self.serve(scope["method"], scope["path"], scope["headers"], client, label, peer)
        finally:
            client.close()

    async def direct(self, request: DirectDownstream) -> None:
        """The server's fast lane (direct.py), in a task: what `express` left to it."""
        path = request.path
        admitted = request.admission if request.admitted else NOT_YET
        await self.serve(request.method, path, request.headers, request, path, request.client_host, admitted)

    def on_head(self, request: DirectDownstream) -> bool:
        """The fast lane's look at a request's head, before its body is read (direct.py): a refusal
        answered at once (True), so a refused client never has a body buffered here."""
        admitted = self.admit(request.method, request.headers)
        if not isinstance(admitted, errors.ErrorResponse):
            request.admission = admitted
            return False
        exchange = self._begin(request.path)
        exchange.status = answer_now(request, admitted)
        self._end(exchange)
        return True

    def express(self, request: DirectDownstream) -> bool:
        """The fast lane's first try (express.py), once the body is in: the steps without awaiting, up
        to the first one that must wait, which goes on in a task. False, with nothing done, for the
        task lane to take it whole (the 413, a client not reading)."""
        if (
            request.body_size > self.max_body_bytes
            or request.write_paused
            or self.pool is None
            or self.reads_off_loop(
                request.body(),
                self.owner(request.headers, request.client_host, request.admission if request.admitted else NOT_YET),
            )
        ):
            return False
        exchange = self._begin(request.path)
        try:
            admitted = request.admission if request.admitted else self.admit(request.method, request.headers)
            if isinstance(admitted, errors.ErrorResponse):
                plan: Plan | errors.ErrorResponse = admitted
            else:
                exchange.admitted = admitted
                plan = self._plan(exchange, request.method, request.path, request.headers, request.body())
            if isinstance(plan, errors.ErrorResponse):
                exchange.status = answer_now(request, plan)
                self._end(exchange)
                return True
            if not self.ready(plan):
                peer = request.client_host
                request.spawn(lambda _: self._wait_and_forward(request, exchange, plan, peer))
                return True
            upstream = self._pick(plan, 0)
        except BaseException:
            self._end(exchange)
            raise
        if upstream is None:
            request.spawn(lambda _: self.go_on(request, exchange, None))
        else:
            Forward(self, request, exchange, plan).send(self.pool, upstream[0])
        return True

    async def serve(
        self,
        method: str,
        path: str,
        headers: Headers,
        client: Downstream,
        label: str,
        peer: str | None = None,
        admitted: Any = NOT_YET,
    ) -> None:
        """The async way, every step: `label`, the route the metrics name; `peer`, the client's address;
        `admitted`, what its head was let in with already (else `admit` now)."""
        exchange = self._begin(label)
        try:
            if admitted is NOT_YET:
                admitted = self.admit(method, headers)
            if isinstance(admitted, errors.ErrorResponse):
                exchange.status = await answer(client, admitted)
                return
            exchange.admitted = admitted
            body = await read_limited_body(headers, client, self.max_body_bytes, exchange)
            if body is None:
                return
            route = self.table.get((method, path))
            owner = self.owner(headers, peer, admitted)  # once: its share of the loop, and its places off it
            if route is not None and self.reads_off_loop(body, owner):
                read = await self.read(route, body, owner)
                if isinstance(read, errors.ErrorResponse):
                    exchange.status = await answer(client, read)
                    return
                exchange.read = read
            plan = self._plan(exchange, method, path, headers, body)
            if isinstance(plan, errors.ErrorResponse):
                exchange.status = await answer(client, plan)
                return
            if self.ready(plan) or await self.wait(plan, client, exchange, peer):
                await self._forward(plan.answer_to or client, exchange, plan, None)
        finally:
            self._end(exchange)

    async def go_on(self, client: Downstream, exchange: Exchange, first: FirstTry) -> None:
        """The rest of a request the express lane sent (or could not send): `first`, what its try gave."""
        assert exchange.plan is not None
        try:
            await self._forward(client, exchange, exchange.plan, first)
        finally:
            self._end(exchange)

    async def _wait_and_forward(self, client: Downstream, exchange: Exchange, plan: Plan, peer: str | None) -> None:
        try:
            if await self.wait(plan, client, exchange, peer):
                await self._forward(plan.answer_to or client, exchange, plan, None)
        finally:
            self._end(exchange)

    # --- what every lane shares ---------------------------------------------------------------------

    def _begin(self, label: str) -> Exchange:
        self.ledger.begun += 1
        exchange = Exchange(perf_counter())
        exchange.route = label
        return exchange

    def _end(self, exchange: Exchange) -> None:
        if exchange.ended:
            self.ledger.broke(ENDED_TWICE)
            return
        exchange.ended = True
        self.ledger.ended += 1
        self.end(exchange)

    def reads_off_loop(self, body: bytes, owner: Hashable) -> bool:
        """Whether `body` is read off the loop (`read`): too many values for it, or more than `owner`'s
        share of it has left (which is then spent by its values). Without a share, never."""
        share = self.loop_share
        if share is None or not body:
            return False
        values = value_count(body)  # counted once: the measure of both the threshold and the share
        return values > MANY_VALUES or not share.take(owner, values)

    def _plan(
        self, exchange: Exchange, method: str, path: str, headers: Headers, body: bytes
    ) -> Plan | errors.ErrorResponse:
        """The route (from this pipeline's table, never the client's spelling) and the proxy's plan."""
        route = self.table.get((method, path))
        if route is None:
            # The dispatcher's allowlist sends only these (and the Ollama adapter, but for the requests
            # it hands over to be refused, which a key reloaded in between could let through to
            # here): nothing else is forwarded.
            return errors.unknown_route(method, path)
        if route.method == "GET" and body:
            # Never forwarded: an upstream that does not frame a GET's body would read it as a request
            # of its own (smuggled past the checks, its answer read by the next client).
            return errors.body_not_allowed(method, path)
        plan = self.plan(route, headers, body, exchange)
        if not isinstance(plan, errors.ErrorResponse):
            exchange.plan = plan
        return plan

    def _pick(self, plan: Plan, attempt: int) -> Upstream | None:
        if plan.upstream is not None:
            self.ledger.broke(PICKED_WHILE_HELD)
            self._release(plan)
        upstream = plan.upstream = self.pick(plan, attempt)
        if upstream is not None:
            self.ledger.picked += 1
        return upstream

    def _release(self, plan: Plan) -> None:
        if plan.upstream is not None:
            self.release(plan)
            plan.upstream = None
            self.ledger.released += 1

    def finish(self, exchange: Exchange) -> None:
        """A forwarded request is over: its pick released, and it ends."""
        assert exchange.plan is not None
        self._release(exchange.plan)
        self._end(exchange)

    def settled(self, exchange: Exchange, tail: bytes | None, error: BaseException | None) -> None:
        plan = exchange.plan
        assert plan is not None
        if plan.settled:
            self.ledger.broke(SETTLED_TWICE)
            return
        plan.settled = True
        self.settle(plan, exchange, tail, error)

    async def _forward(self, client: Downstream, exchange: Exchange, plan: Plan, first: FirstTry) -> None:
        try:
            tail, error = await relay(
                client, exchange, lambda: self._open(plan, first), self.failure, plan.metered, plan.answer_headers
            )
            self.settled(exchange, tail, error)
        finally:
            self._release(plan)

    async def _open(self, plan: Plan, first: FirstTry) -> Response:
        """Send the request, once more on failure; the answer's headers are in when this returns.
        `first`: what the express lane's try gave, to its upstream (`plan.upstream`), if it was sent."""
        pool = self.pool
        assert pool is not None, "the upstream pool opens in the app's lifespan"
        last: BaseException = NoUpstream("no upstream to try")
        for attempt in range(2):
            upstream = plan.upstream if attempt == 0 and plan.upstream is not None else self._pick(plan, attempt)
            if upstream is None:
                break
            try:
                if attempt == 0 and first is not None:
                    if not isinstance(first, Response):
                        raise first
                    response = first
                else:
                    url, fresh = upstream
                    response = await pool.request(plan.route.method, url, plan.headers, plan.body, fresh=fresh)
            except RETRIABLE as exc:
                self._release(plan)
                self.tried(plan, exc)
                last = exc
                continue
            if not self.passes_on(plan, response, attempt):
                return response
            response.release()
            last = PassedOn(f"{upstream[0]} answered {response.status}")
            self._release(plan)
            self.tried(plan, last)
        raise last
