"""The sidecar's steps of the request pipeline (http/pipeline.py, shared with the gateway): check the
key and the request, then stream the engine's answer back chunk by chunk, free of framework layers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Iterable
from time import perf_counter

from modelserve.contracts import routes
from modelserve.contracts.key_entries import KeyEntry
from modelserve.contracts.sidecar import Settings
from modelserve.http import errors, off_loop
from modelserve.http.downstream import Downstream, Exchange, Headers, answer
from modelserve.http.limits import client_bucket
from modelserve.http.loop_share import LoopShare
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.off_loop import OffLoop
from modelserve.http.pipeline import Pipeline, Plan, Upstream
from modelserve.http.relay import HOP_BY_HOP, filter_headers, upstream_error_kind
from modelserve.http.usage import usage_from_tail
from modelserve.http.workers import share

from .adapters import Adapters
from .auth import identify
from .demand import Demand
from .fair_share import FairShare
from .key_limits import IN_FLIGHT, KeyLimiter
from .key_usage import KeyUsage
from .keys import KeyStore
from .metrics import SidecarMetrics, route_label
from .pod_counts import PodCounts
from .replica_share import ReplicaShare
from .request_checks import Checked, check_body, checked_off_loop, request_model

log = logging.getLogger(__name__)

# Also not sent to the engine: Host and Content-Length (aiohttp sets both for the body it sends,
# which may have been rewritten), Expect (uvicorn already answered the client's 100-continue, and the
# whole body is here) and Authorization (the engine has no use for the key; keeps it out of its logs).
DROP_TO_ENGINE = HOP_BY_HOP | {b"host", b"content-length", b"expect", b"authorization"}
RETRY_AFTER_SECONDS = 5
PUBLIC = ""  # the fair share's one queue when no key names a request (public mode)
ENGINE_BUSY = "engine_busy"
# Bodies read off the event loop (http/off_loop.py), as the gateway does: one helper process per
# worker, started at the first such body; at most this many waiting for it, and this many of one
# key's (else one client address's), so one key cannot hold every place.
OFF_LOOP_PENDING = 8
OFF_LOOP_PER_OWNER = 4
# The helper's heap: beside one worker within the sidecar's 512Mi (each further worker brings 256Mi
# more); a 10 MiB body of long text reads in about 40 MiB, 300,000 Ollama messages in about 150.
OFF_LOOP_MEMORY_BYTES = 256 * 1024 * 1024


class EnginePlan(Plan):
    """A request for the engine, its model label (with adapters only: usage per adapter), the named
    key it came with (None in public mode), whether it holds an engine slot (fair_share.py), and the
    tokens its answer reported."""

    __slots__ = ("key", "model", "slot", "tokens")

    def __init__(
        self, route: routes.Route, body: bytes, headers: Headers, model: str | None, key: KeyEntry | None
    ) -> None:
        super().__init__(route, body, headers, route.metered)
        self.model = model
        self.key = key
        self.slot = False
        self.tokens = 0

    @property
    def turn(self) -> tuple[str, int]:
        """Whose turns it takes in the fair share, and their weight: its key's, or the one queue of
        public mode."""
        return (self.key.name, self.key.limits.weight) if self.key is not None else (PUBLIC, 1)


class Proxy(Pipeline):
    """The sidecar's steps: admit (the key), plan (the request checks), pick (the engine, on a new
    connection the second time), settle (usage, engine errors), end (the request's metrics)."""

    def __init__(
        self,
        settings: Settings,
        keys: KeyStore | None,
        metrics: SidecarMetrics,
        adapters: Adapters | None = None,
        pod: PodCounts | None = None,
    ) -> None:
        super().__init__(routes.FORWARDED, settings.max_body_bytes)
        self.settings = settings
        self.adapters = adapters  # None or disabled: the ModelServer serves its base model only
        self.keys = keys  # None in public mode
        self.metrics = metrics
        ledger = self.ledger
        # `pod`: with workers, the counts they share, so the limits and slots are the pod's, not split.
        self.limits = KeyLimiter(pod, settings.workers)
        self.replicas = ReplicaShare(settings.replicas_file)  # how many sidecars share a key's limits
        if keys is not None:  # a removed name's state goes with it: bounded by the Secret's entries
            keys.on_change = lambda: self.limits.keep_only(entry.name for entry in keys.entries)
        # Without shared counts, a worker's part of the engine's slots (share(): rounded up).
        slots = settings.engine_concurrency if pod is not None else share(settings.engine_concurrency, settings.workers)
        self.fair = FairShare(slots, pod)
        self.usage = KeyUsage(
            settings.served_model,
            self.limits.in_flight,
            self.fair.waiting_for,
            metrics.registry,
        )
        self.demand = Demand(lambda: ledger.in_flight)
        # Read when scraped: the pipeline counts requests in flight already, without the gauge's lock.
        metrics.in_flight.set_function(lambda: ledger.in_flight)
        metrics.lifecycle(ledger)
        # The route's own path, the one that was checked: never the raw path the client spelt, and no
        # query (no consumer route takes one; an engine might read one).
        self._targets = {path: settings.upstream_url + path for _, path in routes.FORWARDED}
        self.off_loop_work = OffLoop(OFF_LOOP_PENDING, OFF_LOOP_MEMORY_BYTES, OFF_LOOP_PER_OWNER)
        self.loop_share = LoopShare(settings.loop_share_values_per_second)

    def key_refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> errors.ErrorResponse | None:
        """The 401 for a request whose key is refused (and counted), or None when it may pass."""
        if self.keys is None:
            return None
        entry, reason = identify(headers, self.keys, time.time())
        return None if reason is None else self._refused(entry, reason)

    def _refused(self, entry: KeyEntry | None, reason: str) -> errors.ErrorResponse:
        self.metrics.auth_failures.labels(reason).inc()
        if entry is not None:  # a named key refused (expired): counted by its name too
            self.usage.refused(entry.name, reason)
        return errors.unauthorized(reason)

    # --- the pipeline's steps ---------------------------------------------------------------------

    def admit(self, method: str, headers: Headers) -> errors.ErrorResponse | KeyEntry | None:
        """The key, and for a POST (the work an engine does) its limits, from the head: a request over
        them is refused before any byte of its body is held, and one let in counts against them from
        here until it ends (`end`). Returns the named key a POST holds, None for the rest."""
        if self.keys is None:
            self.demand.arrived()
            return None
        now = time.time()
        key, reason = identify(headers, self.keys, now)
        if reason is not None or key is None:
            return self._refused(key, reason or "invalid")
        if method != "POST":
            self.demand.arrived()
            return None
        over = self.limits.refusal(key, now, self.replicas.count)
        if over is not None:
            self.usage.refused(key.name, over[0])
            return _over_limit(key.name, *over)
        self.limits.started(key.name, now)
        self.usage.started(key.name)
        self.demand.arrived()  # refused requests wake nothing up
        return key

    def owner(self, headers: Headers, peer: str | None, admitted: object) -> tuple[str, str]:
        """A request's named key (its places are the key's: every client reaches a sidecar from the
        gateway's address), else its client's address (public mode)."""
        if isinstance(admitted, KeyEntry):
            return ("key", admitted.name)
        return ("client", client_bucket(peer))

    async def read(self, route: routes.Route, body: bytes, owner: Hashable) -> Checked | errors.ErrorResponse:
        """The request checks of a body of very many JSON values (or past its owner's share of the
        loop), in the helper process."""
        settings = self.settings
        adapters = self._adapters()
        checked = await self.off_loop_work.run(
            checked_off_loop,
            route,
            body,
            settings.served_model,
            settings.vision,
            dict(settings.sampling_defaults),
            dict(settings.sampling_aliases),
            settings.upstream_model,
            dict(adapters.engine_names) if adapters else None,
            owner=owner,
        )
        self.metrics.read_off_loop.labels(off_loop.outcome(checked)).inc()
        return off_loop.refusal(checked, "sidecar", self.off_loop_work.memory_bytes) or checked

    def plan(
        self, route: routes.Route, headers: Headers, body: bytes, exchange: Exchange
    ) -> EnginePlan | errors.ErrorResponse:
        """The body to send the engine and the model label (with adapters), or the error to answer;
        the named key the request holds is `exchange.admitted` (admit); a body checked off the loop
        already is `exchange.read` (read)."""
        model = None
        if route.method == "POST":
            settings = self.settings
            adapters = self._adapters()
            read: Checked | None = exchange.read
            if read is None:
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
                # Only with adapters: one more parse of the body, for usage per adapter.
                named = request_model(checked) if adapters else None
            else:
                checked, named = read.body, read.model
            body = checked
            if adapters:
                model = self._model_label(named, adapters)
        key = exchange.admitted if route.method == "POST" else None
        return EnginePlan(route, body, filter_headers(headers, DROP_TO_ENGINE), model, key)

    def _adapters(self) -> Adapters | None:
        """The adapters served beside the base model, or None (none, or disabled)."""
        return self.adapters if self.adapters is not None and self.adapters.enabled else None

    def ready(self, plan: EnginePlan) -> bool:  # type: ignore[override]
        """An engine slot taken now (a GET never needs one: the model list is no work)."""
        if plan.route.method != "POST":
            return True
        plan.slot = self.fair.take_now(*plan.turn)
        return plan.slot

    async def wait(self, plan: EnginePlan, client: Downstream, exchange: Exchange, peer: str | None) -> bool:  # type: ignore[override]
        """In the key's queue until the engine has a slot for it, at most the upstream timeout."""
        timeout = self.settings.upstream_timeout_seconds
        plan.slot = await self.fair.take(*plan.turn, client.gone(), timeout)
        if plan.slot:
            return True
        if client.gone().done():
            exchange.client_gone = True
        else:
            if plan.key is not None:
                self.usage.refused(plan.key.name, ENGINE_BUSY)
            exchange.status = await answer(client, errors.engine_busy(timeout, RETRY_AFTER_SECONDS))
        return False

    def pick(self, plan: Plan, attempt: int) -> Upstream:
        # The second try is nearly always after a pooled keep-alive connection the engine had just
        # closed or reset (servers close idle or errored connections at will; llama.cpp's closes after
        # every stream while advertising keep-alive): on a new connection (the other idle ones may be
        # as stale). An engine that is really gone then refuses it, which answers 503.
        return self._targets[plan.route.path], attempt > 0

    def settle(self, plan: EnginePlan, exchange: Exchange, tail: bytes | None, error: BaseException | None) -> None:  # type: ignore[override]
        """A relayed answer's counts: the engine's failures, and the usage it reported."""
        if error is not None:
            kind = upstream_error_kind(error)
            self.metrics.upstream_errors.labels(kind).inc()
            log.warning("engine unreachable or broke off (%s): %s", kind, type(error).__name__)
        elif exchange.status >= 500 and not exchange.client_gone:
            self.metrics.upstream_errors.labels("status_5xx").inc()
        usage = usage_from_tail(tail) if tail is not None else None
        self.metrics.count_usage(usage)
        if plan.key is not None and usage is not None:
            plan.tokens = usage[0] + usage[1]
            self.usage.used(plan.key.name, usage)
        if plan.model is not None:
            self.metrics.count_model(plan.model, exchange.status, usage)

    def end(self, exchange: Exchange) -> None:
        plan = exchange.plan
        key = exchange.admitted
        if key is not None:  # what it held of its key's limits since its head (admit)
            self.limits.finished(key.name, plan.tokens if isinstance(plan, EnginePlan) else 0, time.time())
        if isinstance(plan, EnginePlan) and plan.slot:
            plan.slot = False
            self.fair.release()
        status = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
        self.metrics.observe(route_label(exchange.route), status, perf_counter() - exchange.start, exchange.ttfb)

    def failure(self, error: BaseException) -> errors.ErrorResponse:
        if isinstance(error, asyncio.TimeoutError):
            return errors.upstream_timeout(self.settings.upstream_timeout_seconds)
        return errors.engine_unavailable(RETRY_AFTER_SECONDS)

    def _model_label(self, model: str | None, adapters: Adapters) -> str:
        """The served name or an adapter's name (as the client named it), else "other": bounded labels."""
        if model in adapters.adapter_names:
            return adapters.adapter_names[model]
        return self.settings.served_model if model in (None, self.settings.served_model) else "other"


def _over_limit(name: str, reason: str, retry_after: float | None) -> errors.ErrorResponse:
    """The 429 for a key over one of its limits (the name, never the key)."""
    what = {
        IN_FLIGHT: "requests in flight",
        "requests_per_minute": "requests per minute",
        "tokens_per_minute": "tokens per minute",
    }[reason]
    return errors.too_many_requests(f"API key {name!r} is over its limit of {what}.", reason, retry_after)
