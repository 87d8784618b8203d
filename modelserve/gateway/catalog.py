"""GET /v1/models through the gateway: only the models the caller's key opens.

The gateway holds no keys, so it asks: a model's sidecar is sent GET /v1/models with the caller's
own Authorization, and anything but a 401 means the key passed the sidecar's check (keys.proof).
What one list costs is bounded whatever the caller sends: at most `max_asks` sidecars are asked,
those asked longest ago for this key first; each answer is kept per key digest (never the key) for
`ttl` seconds, so a caller's next lists ask the next ones. A model not asked this time, or with no
ready replica to ask, is listed for a key the gateway has seen open it (keys.Opened: these answers
and every answer it relayed) within the last week; the request itself is still checked when it
reaches a replica. Public models are listed to everyone; a caller without a key sees only those.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from modelserve.contracts.names import Key
from modelserve.contracts.pod_urls import url_of
from modelserve.http import ollama

from .directory import Directory, Model
from .keys import Opened, Recent, digest, keyless, proof

ASK_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
CONCURRENT_ASKS = 32
NEVER = float("-inf")
# The answers asks can give: the metrics' label (an answer that may come before the key check,
# or none at all, is no_answer).
OPENED, REFUSED, NO_ANSWER = "opened", "refused", "no_answer"
ANSWERS = (OPENED, REFUSED, NO_ANSWER)


class Catalog:
    def __init__(
        self,
        directory: Directory,
        ttl: float,
        session: Callable[[], aiohttp.ClientSession],
        opened: Opened | None = None,
        max_asks: int = 16,
        asked: Callable[[str], None] = lambda answer: None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.directory = directory
        self._tls = tls  # what a replica serving HTTPS is checked with (the proxy's pool's context)
        self.ttl = ttl
        self.max_asks = max_asks
        self.opened = opened or Opened()
        self._session = session
        self._asked = asked  # the asks' counter, by answer
        # (key digest, model) -> (when asked, what the answer proved: keys.proof)
        self._answers: Recent[tuple[bytes, Key], bool | None] = Recent()
        self._asks = asyncio.Semaphore(CONCURRENT_ASKS)

    async def visible(self, authorization: str | None) -> list[Model]:
        models = sorted(self.directory.models.values(), key=lambda m: (m.name, m.namespace))
        if authorization is None or keyless(authorization.encode("latin-1")):
            return [model for model in models if model.public]
        key_digest = digest(authorization.encode("latin-1"))
        now = time.monotonic()
        shown: dict[Key, bool] = {}
        to_ask: list[tuple[float, Model]] = []  # (when last asked, model)
        for model in models:
            known = self._known(key_digest, model, now)
            if known is None:
                asked = self._answers.get((key_digest, model.key))
                to_ask.append((asked[0] if asked else NEVER, model))
            else:
                shown[model.key] = known
        to_ask.sort(key=lambda pair: pair[0])  # stable: by name among those never asked
        chosen = [model for _, model in to_ask[: self.max_asks]]
        answers = await asyncio.gather(*(self._ask_and_keep(key_digest, authorization, m) for m in chosen))
        shown.update(zip((m.key for m in chosen), answers, strict=True))
        return [model for model in models if shown.get(model.key, self._remembered(key_digest, model, now))]

    async def allows(self, authorization: str | None, model: Model) -> bool:
        """One model's visibility (GET /v1/models/NAME): one ask at most."""
        if authorization is None or keyless(authorization.encode("latin-1")):
            return model.public
        key_digest = digest(authorization.encode("latin-1"))
        known = self._known(key_digest, model, time.monotonic())
        return known if known is not None else await self._ask_and_keep(key_digest, authorization, model)

    def _known(self, key_digest: bytes, model: Model, now: float) -> bool | None:
        """Whether the key opens `model` without asking, or None when its sidecar is to be asked."""
        if model.public:
            return True
        cached = self._answers.get((key_digest, model.key))
        if cached is not None and now - cached[0] < self.ttl:
            # A fresh ask that got no answer says nothing: what the gateway saw before.
            return cached[1] if cached[1] is not None else self._remembered(key_digest, model, now)
        if not model.replicas:
            return self._remembered(key_digest, model, now)
        return None

    def _remembered(self, key_digest: bytes, model: Model, now: float) -> bool:
        return model.public or self.opened.opens(key_digest, model.key, now)

    async def _ask_and_keep(self, key_digest: bytes, authorization: str, model: Model) -> bool:
        answer = await self._ask(model, authorization)
        now = time.monotonic()
        self._asked(NO_ANSWER if answer is None else OPENED if answer else REFUSED)
        self._answers.put((key_digest, model.key), answer, now)
        self.opened.learn(key_digest, model.key, answer, now)
        return answer if answer is not None else self._remembered(key_digest, model, now)

    async def _ask(self, model: Model, authorization: str) -> bool | None:
        replica = model.replicas[0]
        # A key goes to a replica serving HTTPS only once its certificate is checked for its Service's name.
        https = {"ssl": self._tls or True, "server_hostname": model.server_name} if replica.startswith("https") else {}
        async with self._asks:
            try:
                async with self._session().get(
                    url_of(replica, "/v1/models"),
                    headers={"Authorization": authorization},
                    timeout=ASK_TIMEOUT,
                    **https,
                ) as answer:
                    await answer.read()
                    return proof(answer.status)
            except (TimeoutError, aiohttp.ClientError):
                return None


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
