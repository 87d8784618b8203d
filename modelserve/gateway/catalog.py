"""GET /v1/models through the gateway: only the models the caller's key opens.

The gateway holds no keys, so it asks: each model's sidecar is sent GET /v1/models with the
caller's own Authorization, and anything but a 401 means the key passed the sidecar's check.
Answers are cached per key digest (never the key) for `models_cache_seconds`; a model with no
ready replica cannot be asked and is listed for a key that opened it within the last hour (the
request itself is still checked when it reaches a replica). Public models are listed to everyone;
a caller without a key sees only those.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from modelserve.contracts.names import Key
from modelserve.http import ollama

from .directory import Directory, Model

ASK_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
OPENED_MEMORY_SECONDS = 3600.0
MAX_ENTRIES = 100_000  # bounded: distinct bad keys cannot grow the cache without end
CONCURRENT_ASKS = 32


class Catalog:
    def __init__(self, directory: Directory, ttl: float, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.directory = directory
        self.ttl = ttl
        self._session = session
        self._answers: dict[tuple[bytes, Key], tuple[float, bool]] = {}  # -> (when asked, opened)
        self._opened: dict[tuple[bytes, Key], float] = {}  # -> when last seen opened
        self._asks = asyncio.Semaphore(CONCURRENT_ASKS)

    async def visible(self, authorization: str | None) -> list[Model]:
        models = sorted(self.directory.models.values(), key=lambda m: (m.name, m.namespace))
        if authorization is None:
            return [model for model in models if model.public]
        digest = hashlib.sha256(authorization.encode("latin-1")).digest()
        opened = await asyncio.gather(*(self.opens(digest, authorization, model) for model in models))
        return [model for model, ok in zip(models, opened, strict=True) if ok]

    async def allows(self, authorization: str | None, model: Model) -> bool:
        if authorization is None:
            return model.public
        return await self.opens(hashlib.sha256(authorization.encode("latin-1")).digest(), authorization, model)

    async def opens(self, digest: bytes, authorization: str, model: Model) -> bool:
        if model.public:
            return True
        now = time.monotonic()
        cached = self._answers.get((digest, model.key))
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        if not model.replicas:
            seen = self._opened.get((digest, model.key))
            return seen is not None and now - seen < OPENED_MEMORY_SECONDS
        answer = await self._ask(model, authorization)
        if answer is None:  # unreachable: say nothing rather than guess, and ask again next time
            return False
        self._remember(digest, model.key, now, answer)
        return answer

    async def _ask(self, model: Model, authorization: str) -> bool | None:
        async with self._asks:
            try:
                async with self._session().get(
                    f"http://{model.replicas[0]}/v1/models",
                    headers={"Authorization": authorization},
                    timeout=ASK_TIMEOUT,
                ) as answer:
                    await answer.read()
                    return answer.status != 401
            except (TimeoutError, aiohttp.ClientError):
                return None

    def _remember(self, digest: bytes, key: Key, now: float, opened: bool) -> None:
        if len(self._answers) >= MAX_ENTRIES:
            self._answers = {k: v for k, v in self._answers.items() if now - v[0] < self.ttl}
            if len(self._answers) >= MAX_ENTRIES:
                self._answers.clear()
        self._answers[(digest, key)] = (now, opened)
        if opened:
            if len(self._opened) >= MAX_ENTRIES:
                self._opened.clear()
            self._opened[(digest, key)] = now


def model_object(directory: Directory, model: Model) -> dict[str, Any]:
    return {
        "id": directory.listed_name(model),
        "object": "model",
        "created": model.created,
        "owned_by": model.namespace,
    }


def model_objects(directory: Directory, model: Model) -> list[dict[str, Any]]:
    """A ModelServer in GET /v1/models, then each of its adapters naming it as `parent` (as vLLM
    lists them); the same key opens both, so whoever sees the base sees its adapters."""
    base = model_object(directory, model)
    adapters = [
        {**base, "id": directory.listed_name(model, adapter), "parent": base["id"]}
        for adapter in model.adapters
        if directory.resolve_owner(model, adapter)
    ]
    return [base, *adapters]


def ollama_entry(directory: Directory, model: Model) -> dict[str, Any]:
    """A model in Ollama's /api/tags list (what the gateway knows without asking: no size or digest)."""
    name = ollama.listed_name(directory.listed_name(model))
    modified = datetime.fromtimestamp(model.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"name": name, "model": name, "modified_at": modified, "size": 0, "digest": "", "details": {}}


def ollama_entries(directory: Directory, model: Model) -> list[dict[str, Any]]:
    """A ModelServer in Ollama's /api/tags, then its adapters with it as `details.parent_model`."""
    base = ollama_entry(directory, model)
    adapters = []
    for adapter in model.adapters:
        if directory.resolve_owner(model, adapter):
            name = ollama.listed_name(directory.listed_name(model, adapter))
            adapters.append({**base, "name": name, "model": name, "details": {"parent_model": base["name"]}})
    return [base, *adapters]
