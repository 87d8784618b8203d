"""The gateway's ASGI application: its own routes (health, readiness, metrics, held requests, the
model list) in FastAPI, every other path straight to the raw proxy."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from modelserve.contracts import routes
from modelserve.contracts.gateway import (
    GUARDS_ROUTE,
    HEALTH_ROUTE,
    HELD_ROUTE,
    METRICS_ROUTE,
    OWN_ROUTES,
    READY_ROUTE,
    guards_from_json,
    guards_to_json,
    held_from_json,
    held_to_json,
)
from modelserve.contracts.names import PACKAGE_VERSION, Key
from modelserve.http import ollama
from modelserve.http.allowlist import in_error_shape, refuse
from modelserve.http.direct import DirectRoutes
from modelserve.http.metrics import CONTENT_TYPE
from modelserve.http.relay import authorization_header
from modelserve.http.upstream import open_pool, open_session, trusting
from modelserve.http.worker_views import Siblings, for_the_pod, merge_metrics
from modelserve.http.workers import share

from . import errors as gateway_errors
from .catalog import Catalog, model_objects, ollama_entries
from .cold_starts import ColdStarts
from .directory import Ambiguous, Directory, Model, served_name
from .holding import Holding, shared_counts
from .keys import Opened, keyless
from .metrics import GatewayMetrics
from .proxy import GatewayProxy
from .settings import GatewaySettings

if TYPE_CHECKING:
    from .picker import PickerServer

MODELS_ROUTE = "/v1/models"
# Ollama's listing, loaded models and version, answered here like /v1/models (its other routes carry a model).
OLLAMA_GETS = frozenset({ollama.TAGS_ROUTE, ollama.PS_ROUTE, ollama.VERSION_ROUTE})


class Discovery(Protocol):
    """What feeds the directory: the Kubernetes watches (discovery.py), or a fixed table (benchmarks)."""

    def start(self, changed: Callable[[Key], None]) -> None: ...
    def lookup(self, key: Key) -> Model | None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool: ...


class Dispatcher:
    """The gateway's own routes and model lists to FastAPI; requests outside the consumer routes
    refused as a sidecar refuses them (allowlist.py), before any routing; the rest to the proxy.
    Every answer under /api/ is worded Ollama's way, whoever wrote it."""

    def __init__(self, api: FastAPI, proxy: GatewayProxy) -> None:
        self.api = api
        self.proxy = proxy
        self.picker: PickerServer | None = None  # the endpoint picker, while the app serves (its lifespan)
        # What the server's certificate did (http/tls.py, when serving HTTPS), in the metrics.
        self.certificate_changed = proxy.metrics.tls.changed

    def direct_routes(self) -> DirectRoutes:
        """The requests the server hands the proxy without ASGI (direct.py): exactly those this
        dispatcher would send to `self.proxy` with their answers as they are (not Ollama's)."""
        return {
            (method.encode(), path.encode()): self.proxy
            for method, path in routes.FORWARDED
            if path not in OWN_ROUTES and not _model_list(method, path) and routes.error_shape(path) == routes.OPENAI
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_ROUTES:
            await self.api(scope, receive, send)
        elif _model_list(scope["method"], scope["path"]):
            await self.api(scope, receive, in_error_shape(send, scope["path"]))
        elif routes.allowed(scope["method"], scope["path"]) is None:
            await refuse(scope, send, self.proxy.metrics.refused)
        else:
            await self.proxy(scope, receive, in_error_shape(send, scope["path"]))


def _model_list(method: str, path: str) -> bool:
    return method == "GET" and (path == MODELS_ROUTE or path.startswith(MODELS_ROUTE + "/") or path in OLLAMA_GETS)


def build_app(
    settings: GatewaySettings,
    discovery: Discovery,
    directory: Directory | None = None,
    siblings: Siblings | None = None,
) -> Dispatcher:
    """The gateway; with `siblings`, one of its workers (http/workers.py): the requests held per model
    are bounded for the pod (holding.py; its share of the bound per client, or of every bound when the
    workers share no counts), and any worker answers /held, /guards and /metrics for the pod on the port."""
    directory = directory or Directory()
    metrics = GatewayMetrics()
    workers = settings.workers
    rows = siblings.rows if siblings is not None else None
    per_model = 1 if rows is not None else workers
    holding = Holding(
        share(settings.max_held, per_model),
        lambda key, count: metrics.held.labels(*key).set(count),
        share(settings.max_held_unverified, per_model),
        share(settings.max_held_unverified_per_client, workers),
        # A wake nobody has waited for over a whole hold is given up (cold_starts.py).
        ColdStarts(settings.wake_history, settings.hold_seconds),
        lambda key, seconds: metrics.wake.labels(*key).observe(seconds),
        shared=shared_counts(rows, siblings.index) if rows is not None and siblings is not None else None,
    )
    opened = Opened()  # fed by the model lists' asks and the proxied answers alike
    # Replicas serving HTTPS (spec.tls) are checked against this CA, for their Service's name.
    upstream_tls = trusting(settings.upstream_ca_file)
    proxy = GatewayProxy(settings, directory, holding, metrics, opened)

    def session() -> aiohttp.ClientSession:
        assert proxy.session is not None
        return proxy.session

    catalog = Catalog(
        directory,
        settings.models_cache_seconds,
        session,
        opened,
        settings.model_list_asks,
        lambda answer: metrics.model_list_asks.labels(answer).inc(),
        upstream_tls,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        proxy.session = open_session(settings.upstream_max_connections, settings.upstream_timeout_seconds)
        proxy.pool = open_pool(
            settings.upstream_max_connections,
            settings.upstream_timeout_seconds,
            upstream_tls,
            directory.server_names,
        )
        discovery.start(lambda key: loop.call_soon_threadsafe(refresh, key))
        # The endpoint picker, on this loop: with several workers the first one's alone, so that its
        # picks are counted in flight in one place (holding's bounds and /held are the pod's anyway).
        if settings.picker_port and (siblings is None or siblings.index == 0):
            from .picker import PickerServer  # grpc and Envoy's protos: loaded only by a gateway that picks

            dispatcher.picker = PickerServer(proxy, settings, discovery.synced)
            await dispatcher.picker.start()
        try:
            yield
        finally:
            if dispatcher.picker is not None:
                await dispatcher.picker.stop(settings.drain_seconds)
                dispatcher.picker = None
            discovery.stop()
            proxy.off_loop_work.close()
            await proxy.pool.close()
            await proxy.session.close()

    def refresh(key: Key) -> None:
        """A ModelServer or one of its pods changed: take its entry as it is now."""
        model = discovery.lookup(key)
        if model is None:
            directory.remove(key)
            metrics.forget(key)
            proxy.guards.forget(key)
            holding.forget(key)  # held requests find it gone: 404
            return
        directory.put(model)
        proxy.guards.update(model)
        metrics.replicas.labels(*key).set(len(model.replicas))
        if model.replicas:
            holding.wake(key)

    api = FastAPI(title="modelserve-gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @api.get(HEALTH_ROUTE)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get(READY_ROUTE)
    async def readyz() -> JSONResponse:
        # Ready once the watches listed: no one model's state (at zero, failing) makes it unready.
        synced = discovery.synced()
        return JSONResponse({"ready": synced}, status_code=200 if synced else 503)

    @api.get(HELD_ROUTE)
    async def held(request: Request) -> dict[str, Any]:
        counts = Counter(holding.held())
        if (pod := for_the_pod(siblings, request.scope)) is not None:
            for body in await pod.ask_all(HELD_ROUTE):
                counts.update(held_from_json(json.loads(body)))
        return held_to_json(counts)

    @api.get(GUARDS_ROUTE)
    async def guards(request: Request) -> dict[str, Any]:
        reports = proxy.guards.reports()
        if (pod := for_the_pod(siblings, request.scope)) is not None:
            # A version any worker tripped is tripped (the first's figures).
            for body in await pod.ask_all(GUARDS_ROUTE):
                reports = {**guards_from_json(json.loads(body)), **reports}
        return guards_to_json(reports)

    @api.get(METRICS_ROUTE)
    async def scrape(request: Request) -> Response:
        own = metrics.render()
        if (pod := for_the_pod(siblings, request.scope)) is not None:
            own = merge_metrics([own.decode(), *(body.decode() for body in await pod.ask_all(METRICS_ROUTE))])
        return Response(own, media_type=CONTENT_TYPE)

    @api.get(MODELS_ROUTE)
    async def models(request: Request) -> dict[str, Any]:
        visible = await catalog.visible(_authorization(request))
        items = [item for model in visible for item in model_objects(directory, model)]
        return {"object": "list", "data": once(items, "id")}  # versions of one served name: listed once

    @api.get(MODELS_ROUTE + "/{name:path}")
    async def one_model(name: str, request: Request) -> Any:
        try:
            model = directory.resolve(name)
        except Ambiguous as ambiguous:
            if not ambiguous.public and _authorization(request) is None:
                return _error(gateway_errors.unknown_model(name))  # as for any model it may not see
            return _error(gateway_errors.ambiguous_model(ambiguous.name, ambiguous.namespaces))
        if model is None or not await catalog.allows(_authorization(request), model):
            return _error(gateway_errors.unknown_model(name))
        served = served_name(name)
        return next(item for item in model_objects(directory, model) if served_name(item["id"]) == served)

    @api.get(ollama.TAGS_ROUTE)
    async def ollama_tags(request: Request) -> dict[str, Any]:
        visible = await catalog.visible(_authorization(request))
        return {"models": once([entry for model in visible for entry in ollama_entries(directory, model)], "name")}

    @api.get(ollama.PS_ROUTE)
    async def ollama_ps(request: Request) -> dict[str, Any]:
        visible = await catalog.visible(_authorization(request))
        return {
            "models": once(
                [
                    ollama.loaded(entry)
                    for model in visible
                    if model.replicas
                    for entry in ollama_entries(directory, model)
                ],
                "name",
            )
        }

    @api.get(ollama.VERSION_ROUTE)
    async def ollama_version() -> dict[str, str]:
        return {"version": ollama.version_string(PACKAGE_VERSION)}

    dispatcher = Dispatcher(api, proxy)
    return dispatcher


def once(entries: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """The entries with the first of each `field` value: versions of one served name list it once."""
    seen: set[Any] = set()
    return [entry for entry in entries if not (entry[field] in seen or seen.add(entry[field]))]


def _authorization(request: Request) -> str | None:
    """The caller's Authorization, or None for a caller without a key (keys.keyless)."""
    value = authorization_header(request.scope["headers"])
    return None if value is None or keyless(value) else value.decode("latin-1")


def _error(error: Any) -> Response:
    body = error.body()
    return Response(body, error.status, headers={k.decode(): v.decode() for k, v in error.headers(body)})
