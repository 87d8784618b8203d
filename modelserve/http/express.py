"""The express lane: a proxied request sent upstream and answered from the connections' callbacks,
with no task, no future and no coroutine, when it goes the common way: its body already in, an idle
pooled connection to the upstream, and the whole answer arriving with its headers.

Why: profiles of the fast lane (direct.py) still charged a task, two awaited futures, ten coroutine
frames and two more turns of the event loop to every request; here one request is the client's read
that writes upstream and the upstream's read that writes the answer back, as nginx does it.

Anything else goes on in a task of the request's own, from where this stopped, in the proxies' one
async way (relay.py): a stream or a partial answer, no idle connection, a failed exchange (the
proxies' retries), a slow client. The proxy hands over its own steps as callbacks, so what it counts
and how it retries is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from . import errors
from .direct import DirectDownstream
from .downstream import Exchange, Headers
from .relay import answer_head, whole_body
from .upstream_pool import Disconnected, Pool, Response, _Connection

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
    """One request's exchange with its upstream on the express lane.

    `settle(tail, error)` is the proxy's accounting of a relayed answer (usage, error counts), `end()`
    its accounting of every request, and `go_on(outcome)` the rest of its async way for a request
    that leaves this lane; `go_on` runs in a task and does its own accounting."""

    __slots__ = (
        "connection",
        "count_usage",
        "end",
        "exchange",
        "extra_headers",
        "go_on",
        "passed_on",
        "request",
        "settle",
    )

    def __init__(
        self,
        request: DirectDownstream,
        exchange: Exchange,
        count_usage: bool,
        extra_headers: Callable[[], Iterable[tuple[bytes, bytes]]] | None,
        settle: Callable[[bytes | None, BaseException | None], None],
        end: Callable[[], None],
        go_on: Callable[[FirstTry], Awaitable[None]],
        passed_on: Callable[[Response], bool] | None = None,
    ) -> None:
        self.request = request
        self.exchange = exchange
        self.count_usage = count_usage
        self.extra_headers = extra_headers
        self.settle = settle
        self.end = end
        self.go_on = go_on
        self.passed_on = passed_on  # a complete answer the async way deals with (the gateway's 503s)
        self.connection: _Connection | None = None

    def send(self, pool: Pool, method: str, url: str, headers: Headers, body: bytes) -> None:
        try:
            connection = pool.send_now(method, url, headers, body, self._answered)
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
        if (
            not isinstance(outcome, Response)
            or not outcome.complete
            or request.write_paused
            or (self.passed_on is not None and self.passed_on(outcome))
        ):
            self._leave(outcome)
            return
        try:
            headers, tail = answer_head(outcome, self.exchange, self.count_usage, self.extra_headers)
            request.whole_now(outcome.status, headers, whole_body(outcome, self.exchange, tail))
        except Exception as exc:  # as a task's failure (direct._run)
            request.failed(exc)
            self.end()
            return
        finally:
            outcome.release()
        self.settle(tail.bytes() if tail is not None else None, None)
        self.end()

    def _leave(self, outcome: FirstTry) -> None:
        """Go on the async way, in a task of the request's own."""
        go_on = self.go_on
        self.request.spawn(lambda _: go_on(outcome))

    def _client_gone(self) -> None:
        """The client went away while the upstream had not answered: closing the connection is how
        the engine learns it (it aborts the generation)."""
        self._drop()
        self.exchange.client_gone = True
        self.settle(None, None)
        self.end()

    def cancel(self, msg: str | None = None) -> None:
        """The server's drain deadline passed with no answer yet: as a cancelled task, a 500. (The
        server is going over its set of tasks: this leaves it on the loop's next turn.)"""
        self._drop(untrack_now=False)
        log.error("%s %s still waiting for its upstream at the drain deadline", self.request.method, self.request.path)
        self.request.internal_error()
        self.end()

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
