"""Readiness: the engine answers its health check and lists the served model; one warm-up request
after it first does.

A busy engine answers its health check late, and is no less ready for it: /readyz answers from the
latest finished check while a slow one runs, so the kubelet's probe never times out waiting for
the engine. The engine loses readiness when it says so (a non-200 health answer), refuses the
connection (gone), or stays silent past its probe timeout (hung)."""

from __future__ import annotations

import asyncio
import json
import logging
from time import monotonic, perf_counter
from typing import TYPE_CHECKING, Any

import aiohttp

from modelserve.contracts.sidecar import Settings

from .metrics import SidecarMetrics

if TYPE_CHECKING:
    from .adapters import Adapters

log = logging.getLogger(__name__)

CACHE_SECONDS = 1.0  # probes from several kubelet checks within a second share one engine round trip
ANSWER_SECONDS = 0.5  # how long /readyz waits for a running check before it answers the latest verdict
POLL_SECONDS = 0.5  # how often the start-up watcher asks until the engine is first ready
WARMUP_PROMPT = "Hello"
# How long a starting replica waits for the adapters it was started with (each loaded or refused)
# before it turns Ready anyway: a request for an adapter should not meet a replica without it.
ADAPTERS_AT_START_SECONDS = 300.0


def listed_models(payload: Any) -> list[str]:
    """Model ids from an OpenAI `/v1/models` answer (pure)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


class Readiness:
    def __init__(self, settings: Settings, metrics: SidecarMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None  # opened by the app's lifespan
        self.warmed_up = False
        self._result: tuple[bool, str] = (False, "not checked yet")
        self._checked_at = float("-inf")
        self._checking: asyncio.Task[None] | None = None
        self._timeout = aiohttp.ClientTimeout(total=settings.engine_probe_timeout_seconds)
        self.adapters: Adapters | None = None

    async def status(self) -> tuple[bool, str]:
        """(ready, why): what /readyz reports."""
        ready, reason = await self.engine_ready()
        if ready and not self.warmed_up:
            return False, "warming up the engine"
        return ready, reason

    async def engine_ready(self) -> tuple[bool, str]:
        """The latest verdict, after starting a check when it is older than CACHE_SECONDS and giving
        the check in progress (one at a time) ANSWER_SECONDS to finish."""
        if self._checking is None and monotonic() - self._checked_at >= CACHE_SECONDS:
            self._checking = asyncio.create_task(self._refresh())
        if self._checking is not None:
            await asyncio.wait([self._checking], timeout=ANSWER_SECONDS)  # never cancels the check
        return self._result

    async def close(self) -> None:
        """Stop a check in progress (at shutdown, before the session closes)."""
        if self._checking is not None:
            self._checking.cancel()
            await asyncio.gather(self._checking, return_exceptions=True)

    async def _refresh(self) -> None:
        try:
            self._result = await self._check()
            self._checked_at = monotonic()
        finally:
            self._checking = None

    async def _check(self) -> tuple[bool, str]:
        assert self.session is not None
        base = self.settings.upstream_url
        try:
            async with self.session.get(base + self.settings.engine_health_path, timeout=self._timeout) as health:
                if health.status != 200:
                    return False, f"engine health check answered {health.status}"
            async with self.session.get(base + "/v1/models", timeout=self._timeout) as models:
                if models.status != 200:
                    return False, f"engine /v1/models answered {models.status}"
                listed = listed_models(await models.json(content_type=None))
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            return False, f"engine not reachable ({type(exc).__name__})"
        if self.settings.engine_model not in listed:
            return False, f"engine does not list {self.settings.engine_model!r} (lists {listed})"
        return True, "ready"

    async def watch(self) -> None:
        """Wait for the engine to be ready for the first time (and its adapters to be loaded or
        refused), then warm it up once."""
        while not (await self.engine_ready())[0]:
            await asyncio.sleep(POLL_SECONDS)
        deadline = monotonic() + ADAPTERS_AT_START_SECONDS
        while self.adapters is not None and not self.adapters.settled() and monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
        await self._warm_up()
        self.warmed_up = True

    async def _warm_up(self) -> None:
        assert self.session is not None
        request = {
            "model": self.settings.engine_model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": WARMUP_PROMPT}],
        }
        start = perf_counter()
        try:
            # The session skips aiohttp's automatic Content-Type (the proxy forwards the client's).
            async with self.session.post(
                self.settings.upstream_url + "/v1/chat/completions",
                data=json.dumps(request),
                headers={"Content-Type": "application/json"},
            ) as answer:
                await answer.read()
                outcome = "ok" if answer.status == 200 else "error"
                detail = f"answered {answer.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            outcome, detail = "error", f"failed ({type(exc).__name__})"
        latency = perf_counter() - start
        # A failed warm-up (an embedding-only model has no chat) does not block readiness.
        self.metrics.warmups.labels(outcome).inc()
        self.metrics.warmup_duration.set(latency)
        log.info("warm-up request %s in %.3f s", detail, latency)
