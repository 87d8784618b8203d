"""The ASGI application: the proxy for every path except the sidecar's own three routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from modelserve.contracts import routes
from modelserve.contracts.adapters import ADAPTERS_ROUTE
from modelserve.contracts.sidecar import HEALTH_ROUTE, LOAD_ROUTE, METRICS_ROUTE, OWN_ROUTES, READY_ROUTE, Settings
from modelserve.http.allowlist import refuse
from modelserve.http.direct import DirectRoutes
from modelserve.http.metrics import CONTENT_TYPE
from modelserve.http.ollama import ROUTES as OLLAMA_ROUTES
from modelserve.http.upstream import METRICS_TIMEOUT, open_pool, open_session

from .adapters import Adapters
from .keys import KeyStore
from .metrics import SidecarMetrics
from .ollama_asgi import OllamaAdapter
from .proxy import Proxy
from .readiness import Readiness


class Dispatcher:
    """Sends proxied paths straight to the raw ASGI proxy, so FastAPI's routing (which doubled the
    per-request cost in measurements) only ever sees the sidecar's own routes and the lifespan.
    Anything else that is not a consumer route is refused here (allowlist.py); Ollama's routes go to
    their adapter, which wraps the same proxy."""

    def __init__(self, api: FastAPI, proxy: Proxy, ollama: OllamaAdapter) -> None:
        self.api = api
        self.proxy = proxy
        self.ollama = ollama

    def direct_routes(self) -> DirectRoutes:
        """The requests the server hands the proxy without ASGI (direct.py): exactly those this
        dispatcher would send to `self.proxy` as they are."""
        return {
            (method.encode(), path.encode()): self.proxy
            for method, path in routes.FORWARDED
            if path not in OWN_ROUTES and path not in OLLAMA_ROUTES
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_ROUTES:
            await self.api(scope, receive, send)
        elif routes.allowed(scope["method"], scope["path"]) is None:
            await refuse(scope, send, self.proxy.metrics.refused)
        elif scope["path"] in OLLAMA_ROUTES:
            await self.ollama(scope, receive, send)
        else:
            await self.proxy(scope, receive, send)


def build_app(settings: Settings) -> Dispatcher:
    metrics = SidecarMetrics()
    keys = None if settings.auth_public else KeyStore(settings.keys_dir)
    readiness = Readiness(settings, metrics)

    async def engine_ready() -> bool:
        return (await readiness.engine_ready())[0]

    adapters = Adapters(settings, engine_ready)
    readiness.adapters = adapters
    proxy = Proxy(settings, keys, metrics, adapters)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The proxied requests' pool, and aiohttp for the sidecar's own probes and scrapes.
        session = open_session(settings.upstream_max_connections, settings.upstream_timeout_seconds)
        readiness.session = session
        adapters.session = session
        proxy.pool = open_pool(settings.upstream_max_connections, settings.upstream_timeout_seconds)
        tasks = [asyncio.create_task(readiness.watch())]
        if keys is not None:
            tasks.append(asyncio.create_task(keys.watch()))
            tasks.append(asyncio.create_task(proxy.replicas.watch()))
        if adapters.enabled:
            tasks.append(asyncio.create_task(adapters.watch()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await readiness.close()
            await proxy.pool.close()
            await session.close()

    api = FastAPI(title="modelserve-sidecar", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @api.get(HEALTH_ROUTE)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get(READY_ROUTE)
    async def readyz() -> JSONResponse:
        ready, reason = await readiness.status()
        return JSONResponse({"ready": ready, "reason": reason}, status_code=200 if ready else 503)

    @api.get(LOAD_ROUTE)
    async def load() -> dict[str, Any]:
        return proxy.demand.now().to_json()

    @api.get(ADAPTERS_ROUTE)
    async def adapter_states() -> dict[str, Any]:
        return {"adapters": [state.to_json() for state in adapters.states()]}

    @api.get(METRICS_ROUTE)
    async def scrape(request: Request) -> Response:
        refused = None if settings.metrics_public else proxy.key_refusal(request.scope["headers"])
        if refused is not None:
            body = refused.body()
            headers = {name.decode(): value.decode() for name, value in refused.headers(body)}
            return Response(body, refused.status, headers=headers)
        return Response(metrics.render(await engine_metrics()), media_type=CONTENT_TYPE)

    async def engine_metrics() -> bytes | None:
        assert readiness.session is not None
        if not settings.engine_metrics:
            return None  # nothing to scrape upstream, and no error to count
        try:
            async with readiness.session.get(
                settings.upstream_url + settings.engine_metrics_path,
                headers={"Accept": "text/plain"},
                timeout=METRICS_TIMEOUT,
            ) as answer:
                if answer.status == 200:
                    return await answer.read()
        except (TimeoutError, aiohttp.ClientError):
            pass
        metrics.upstream_errors.labels("metrics").inc()
        return None

    return Dispatcher(api, proxy, OllamaAdapter(proxy, settings))
