"""The express lane: a proxied request sent upstream and answered from the connections' callbacks,
with no task, no future and no coroutine, when it goes the common way: its body already in, an idle
pooled connection to the upstream, and the whole answer arriving with its headers.

Why: profiles of the fast lane (direct.py) still charged a task, two awaited futures, ten coroutine
frames and two more turns of the event loop to every request; here one request is the client's read
that writes upstream and the upstream's read that writes the answer back, as nginx does it.

Anything else goes on in a task of the request's own, from where this stopped, in the proxies' one
async way (pipeline.py): a stream or a partial answer, no idle connection, a failed exchange (the
proxies' retries), a slow client. The steps (what is counted, how it retries) are the pipeline's, the
same on both ways.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import errors
from .direct import DirectDownstream
from .downstream import Exchange
from .relay import answer_head, whole_body
from .upstream_pool import Disconnected, Pool, Response, _Connection

if TYPE_CHECKING:  # the pipeline runs this lane (it imports this module)
    from .pipeline import Pipeline, Plan

log = logging.getLogger(__name__)

# What the first exchange gave, for the async way to go on from: the response (its headers in), the
# error, or None when it could not be sent (no idle connection).
FirstTry = Response | BaseException | None


def answer_now(request: DirectDownstream, error: errors.ErrorResponse) -> int:
    """`downstream.answer` without awaiting: one of our own errors; its status."""
    body = error.body()
    request.whole_now(error.status, error.headers(body), body)
    return error.status


class Forward:
    """One request's exchange with its upstream on the express lane, for `pipeline` (pipeline.py): its
    answer written from the upstream connection's callback when it comes whole, else the request
    handed to a task of its own (`pipeline.go_on`) with what the try gave."""

    __slots__ = ("connection", "exchange", "pipeline", "plan", "request")

    def __init__(self, pipeline: Pipeline, request: DirectDownstream, exchange: Exchange, plan: Plan) -> None:
        self.pipeline = pipeline
        self.request = request
        self.exchange = exchange
        self.plan = plan
        self.connection: _Connection | None = None

    def send(self, pool: Pool, url: str) -> None:
        plan = self.plan
        try:
            connection = pool.send_now(plan.route.method, url, plan.headers, plan.body, self._answered)
        except Disconnected as exc:
            self._leave(exc)
            return
        if connection is None:
            self._leave(None)
            return
        self.connection = connection
        self.request.on_lost = self._client_gone
        self.request.track(self)

    def _answered(self, connection: _Connection) -> None:
        request = self.request
        request.on_lost = None
        request.untrack(self)
        self.connection = None
        outcome = connection.answer()
        pipeline, plan, exchange = self.pipeline, self.plan, self.exchange
        if (
            not isinstance(outcome, Response)
            or not outcome.complete
            or request.write_paused
            or pipeline.passes_on(plan, outcome, 0)
        ):
            self._leave(outcome)
            return
        try:
            headers, tail = answer_head(outcome, exchange, plan.metered, plan.answer_headers)
            request.whole_now(outcome.status, headers, whole_body(outcome, exchange, tail))
        except Exception as exc:  # as a task's failure (direct._run)
            request.failed(exc)
            pipeline.finish(exchange)
            return
        finally:
            outcome.release()
        pipeline.settled(exchange, tail.bytes() if tail is not None else None, None)
        pipeline.finish(exchange)

    def _leave(self, outcome: FirstTry) -> None:
        """Go on the async way, in a task of the request's own."""
        pipeline, request, exchange = self.pipeline, self.request, self.exchange
        request.spawn(lambda _: pipeline.go_on(request, exchange, outcome))

    def _client_gone(self) -> None:
        """The client went away while the upstream had not answered: closing the connection is how
        the engine learns it (it aborts the generation)."""
        self._drop()
        self.exchange.client_gone = True
        self.pipeline.settled(self.exchange, None, None)
        self.pipeline.finish(self.exchange)

    def cancel(self, msg: str | None = None) -> None:
        """The server's drain deadline passed with no answer yet: as a cancelled task, a 500. (The
        server is going over its set of tasks: this leaves it on the loop's next turn.)"""
        self._drop(untrack_now=False)
        log.error("%s %s still waiting for its upstream at the drain deadline", self.request.method, self.request.path)
        self.request.internal_error()
        self.pipeline.finish(self.exchange)

    def _drop(self, untrack_now: bool = True) -> None:
        request = self.request
        request.on_lost = None
        if untrack_now:
            request.untrack(self)
        else:
            request.loop.call_soon(request.untrack, self)
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.on_answer = None
            connection.close()
