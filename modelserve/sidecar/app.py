"""The ASGI application: the proxy for every path except the sidecar's own three routes."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from modelserve.contracts import routes
from modelserve.contracts.adapters import ADAPTERS_ROUTE
from modelserve.contracts.sidecar import (
    DRAINED_ROUTE,
    HEALTH_ROUTE,
    LOAD_ROUTE,
    METRICS_ROUTE,
    OWN_ROUTES,
    READY_ROUTE,
    PodLoad,
    Settings,
)
from modelserve.http.allowlist import refuse
from modelserve.http.direct import DirectRoutes
from modelserve.http.metrics import CONTENT_TYPE
from modelserve.http.ollama import ROUTES as OLLAMA_ROUTES
from modelserve.http.upstream import METRICS_TIMEOUT, open_pool, open_session
from modelserve.http.worker_views import Siblings, ask, for_the_pod, merge_metrics

from .adapters import Adapters
from .drained import Drain
from .keys import KeyStore
from .metrics import SidecarMetrics
from .ollama_asgi import OllamaAdapter
from .pod_counts import NUDGE, PodCounts
from .proxy import Proxy
from .readiness import Readiness

PUBLISH_SECONDS = 1.0  # how stale another worker's minute counts may be (pod_counts.py)


async def every(interval: float, step: Callable[[], object]) -> None:
    """`step()` every `interval` seconds until cancelled (the lifespan owns the task)."""
    while True:
        await asyncio.sleep(interval)
        step()


class Dispatcher:
    """Sends proxied paths straight to the raw ASGI proxy, so FastAPI's routing (which doubled the
    per-request cost in measurements) only ever sees the sidecar's own routes and the lifespan.
    Anything else that is not a consumer route is refused here (allowlist.py); Ollama's routes go to
    their adapter, which wraps the same proxy."""

    def __init__(self, api: FastAPI, proxy: Proxy, ollama: OllamaAdapter, drain: Drain) -> None:
        self.api = api
        self.proxy = proxy
        self.ollama = ollama
        self.drain = drain
        # What the server's certificate did (http/tls.py, when serving HTTPS: spec.tls), in the metrics.
        self.certificate_changed = proxy.metrics.tls.changed

    def told_to_stop(self) -> None:
        """The server was told to stop (http/serve.py calls it from its signal handler)."""
        self.drain.stop()

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


def build_app(settings: Settings, siblings: Siblings | None = None) -> Dispatcher:
    """The sidecar; with `siblings`, one of its workers (http/workers.py). Any worker answers /load
    and /metrics for the pod, asking the others for theirs; worker 0 alone warms the engine up and
    loads its adapters, so /readyz and /adapters are its answers, asked of it by the others."""
    primary = siblings is None or siblings.index == 0
    metrics = SidecarMetrics()
    keys = None if settings.auth_public else KeyStore(settings.keys_dir)
    readiness = Readiness(settings, metrics)

    async def engine_ready() -> bool:
        return (await readiness.engine_ready())[0]

    adapters = Adapters(settings, engine_ready, manages=primary)
    readiness.adapters = adapters
    pod = PodCounts(siblings.rows, siblings.index) if siblings is not None and siblings.rows is not None else None
    proxy = Proxy(settings, keys, metrics, adapters, pod)
    drain = Drain(proxy.demand.in_flight, pod, metrics.drain_waiting)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The proxied requests' pool, and aiohttp for the sidecar's own probes and scrapes.
        session = open_session(settings.upstream_max_connections, settings.upstream_timeout_seconds)
        readiness.session = session
        adapters.session = session
        # Room for the engine's whole batch: requests past the pool's connections would queue in it, in
        # arrival order, not by key.
        connections = max(settings.upstream_max_connections, settings.engine_concurrency)
        proxy.pool = open_pool(connections, settings.upstream_timeout_seconds)
        tasks = [asyncio.create_task(readiness.watch())] if primary else []
        tasks.append(asyncio.create_task(drain.publish()))
        loop = asyncio.get_running_loop()
        if pod is not None:  # the other workers wake this one when a slot it is first for frees
            loop.add_signal_handler(NUDGE, proxy.fair.nudged)
            pod.listen(True)
        if keys is not None:
            tasks.append(asyncio.create_task(keys.watch()))
            tasks.append(asyncio.create_task(proxy.replicas.watch()))
            if pod is not None:
                tasks.append(asyncio.create_task(every(PUBLISH_SECONDS, lambda: proxy.limits.publish_all(time.time()))))
        if adapters.enabled:
            tasks.append(asyncio.create_task(adapters.watch()))
        try:
            yield
        finally:
            drain.finished()
            if pod is not None:  # before the loop closes: its handler would become the default, to exit
                pod.listen(False)
                loop.remove_signal_handler(NUDGE)
                signal.signal(NUDGE, signal.SIG_IGN)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await readiness.close()
            proxy.off_loop_work.close()
            await proxy.pool.close()
            await session.close()

    api = FastAPI(title="modelserve-sidecar", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @api.get(HEALTH_ROUTE)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    def authorization(request: Request) -> list[tuple[str, str]]:
        value = request.headers.get("authorization")
        return [("Authorization", value)] if value else []

    async def from_primary(request: Request) -> Response | None:
        """Worker 0's own answer, for a route only it can give (it warms the engine up and loads
        its adapters), when this worker is not it."""
        pod = for_the_pod(siblings, request.scope)
        if primary or pod is None:
            return None
        try:
            answer = await ask(pod.primary, request.url.path, authorization(request))
        except (OSError, TimeoutError, ValueError) as exc:  # starting again after it died, or stopping
            reason = f"worker 0 does not answer ({type(exc).__name__})"
            return JSONResponse({"ready": False, "reason": reason}, status_code=503)
        return Response(answer.body, answer.status, media_type=answer.content_type or None)

    @api.get(READY_ROUTE)
    async def readyz(request: Request) -> Response:
        if (forwarded := await from_primary(request)) is not None:
            return forwarded
        ready, reason = await readiness.status()
        return JSONResponse({"ready": ready, "reason": reason}, status_code=200 if ready else 503)

    @api.get(DRAINED_ROUTE)
    async def drained() -> Response:
        why = await drain.until_drained(settings.drain_seconds)
        return JSONResponse({"drained": why == "drained", "reason": why})

    @api.get(LOAD_ROUTE)
    async def load(request: Request) -> Response:
        own = proxy.demand.now()
        if (pod := for_the_pod(siblings, request.scope)) is not None:
            theirs = await pod.ask_all(LOAD_ROUTE)
            own = PodLoad.total([own, *(PodLoad.from_json(json.loads(body)) for body in theirs)])
        return JSONResponse(own.to_json())

    @api.get(ADAPTERS_ROUTE)
    async def adapter_states(request: Request) -> Response:
        if (forwarded := await from_primary(request)) is not None:
            return forwarded
        return JSONResponse({"adapters": [state.to_json() for state in adapters.states()]})

    @api.get(METRICS_ROUTE)
    async def scrape(request: Request) -> Response:
        refused = None if settings.metrics_public else proxy.key_refusal(request.scope["headers"])
        if refused is not None:
            body = refused.body()
            headers = {name.decode(): value.decode() for name, value in refused.headers(body)}
            return Response(body, refused.status, headers=headers)
        if siblings is None:
            return Response(metrics.render(await engine_metrics()), media_type=CONTENT_TYPE)
        if (pod := for_the_pod(siblings, request.scope)) is None:
            return Response(metrics.render(None), media_type=CONTENT_TYPE)
        theirs = await pod.ask_all(METRICS_ROUTE, authorization(request))
        ours = merge_metrics([metrics.render(None).decode(), *(body.decode() for body in theirs)])
        return Response(ours + (await engine_metrics() or b""), media_type=CONTENT_TYPE)

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

    return Dispatcher(api, proxy, OllamaAdapter(proxy, settings), drain)
