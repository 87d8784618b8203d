"""The sidecar's steps of the request pipeline (http/pipeline.py, shared with the gateway): check the
key and the request, then stream the engine's answer back chunk by chunk, free of framework layers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from time import perf_counter

from modelserve.contracts import routes
from modelserve.contracts.sidecar import Settings
from modelserve.http import errors
from modelserve.http.downstream import Exchange, Headers
from modelserve.http.metrics import CLIENT_CLOSED, status_class
from modelserve.http.pipeline import Pipeline, Plan, Upstream
from modelserve.http.relay import HOP_BY_HOP, filter_headers, upstream_error_kind
from modelserve.http.usage import usage_from_tail

from .adapters import Adapters
from .auth import refusal_reason
from .demand import Demand
from .keys import KeyStore
from .metrics import SidecarMetrics, route_label
from .request_checks import check_body, request_model

log = logging.getLogger(__name__)

# Also not sent to the engine: Host and Content-Length (aiohttp sets both for the body it sends,
# which may have been rewritten), Expect (uvicorn already answered the client's 100-continue, and the
# whole body is here) and Authorization (the engine has no use for the key; keeps it out of its logs).
DROP_TO_ENGINE = HOP_BY_HOP | {b"host", b"content-length", b"expect", b"authorization"}
RETRY_AFTER_SECONDS = 5


class EnginePlan(Plan):
    """A request for the engine, and its model label (with adapters only: usage per adapter)."""

    __slots__ = ("model",)

    def __init__(self, route: routes.Route, body: bytes, headers: Headers, model: str | None) -> None:
        super().__init__(route, body, headers, route.metered)
        self.model = model


class Proxy(Pipeline):
    """The sidecar's steps: admit (the key), plan (the request checks), pick (the engine, on a new
    connection the second time), settle (usage, engine errors), end (the request's metrics)."""

    def __init__(
        self, settings: Settings, keys: KeyStore | None, metrics: SidecarMetrics, adapters: Adapters | None = None
    ) -> None:
        super().__init__(routes.FORWARDED, settings.max_body_bytes)
        self.settings = settings
        self.adapters = adapters  # None or disabled: the ModelServer serves its base model only
        self.keys = keys  # None in public mode
        self.metrics = metrics
        ledger = self.ledger
        self.demand = Demand(lambda: ledger.in_flight)
        # Read when scraped: the pipeline counts requests in flight already, without the gauge's lock.
        metrics.in_flight.set_function(lambda: ledger.in_flight)
        metrics.lifecycle(ledger)
        # The route's own path, the one that was checked: never the raw path the client spelt, and no
        # query (no consumer route takes one; an engine might read one).
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

    # --- the pipeline's steps ---------------------------------------------------------------------

    def admit(self, headers: Headers) -> errors.ErrorResponse | None:
        refused = self.key_refusal(headers)
        if refused is None:
            self.demand.arrived()  # refused requests wake nothing up
        return refused

    def plan(self, route: routes.Route, headers: Headers, body: bytes) -> EnginePlan | errors.ErrorResponse:
        """The body to send the engine and the model label (with adapters), or the error to answer."""
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
        return EnginePlan(route, body, filter_headers(headers, DROP_TO_ENGINE), model)

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
        if plan.model is not None:
            self.metrics.count_model(plan.model, exchange.status, usage)

    def end(self, exchange: Exchange) -> None:
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
