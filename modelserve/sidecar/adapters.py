"""LoRA adapters: the sidecar keeps its engine's loaded adapters equal to the list in the mounted
ConfigMap (contracts/adapters.py), through the engine's administration routes on 127.0.0.1.

Only this loop calls those routes: the engine listens on the pod's loopback, which only the pod's
own containers reach, and the sidecar's allowlist refuses the routes to every client, key or not.
Level-based: each round compares the list with what the engine itself lists in /v1/models, so an
engine that restarted (and lost its adapters) gets them again, and so does every new replica."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from time import monotonic, perf_counter
from types import MappingProxyType
from typing import Any

import aiohttp

from modelserve.contracts.adapters import (
    ADAPTERS_KEY,
    ENGINE_ROUTES,
    AdapterApi,
    AdapterState,
    Desired,
    Phase,
    parse_desired,
)
from modelserve.contracts.sidecar import Settings

from .readiness import listed_models

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # a changed ConfigMap reaches the file within the kubelet's sync; this adds at most 1 s
RETRY_SECONDS = 60.0  # a refused adapter is asked for again after this (or at once when its entry changes)
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=600)  # a hub download may be part of the load
LIST_TIMEOUT = aiohttp.ClientTimeout(total=10)
MESSAGE_LIMIT = 500


def engine_message(status: int, text: str) -> str:
    """The engine's own words from an error answer: vLLM's {"error": {"message"}}, SGLang's
    {"error_message"} or {"message"}, else the text (pure)."""
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:MESSAGE_LIMIT]
        for key in ("error_message", "message", "detail"):
            if body.get(key):
                return str(body[key])[:MESSAGE_LIMIT]
    return f"engine answered {status}: {text.strip()[:MESSAGE_LIMIT]}"


def read_desired(path: Path) -> tuple[Desired, ...] | None:
    """The mounted list, or None when it cannot be read now (keeps the last one)."""
    try:
        return parse_desired(path.read_text())
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as exc:
        log.warning("cannot read adapters from %s: %s", path, exc)
        return None


class Adapters:
    """The reconcile loop and what it knows; `states()` is what the sidecar's /adapters answers."""

    def __init__(self, settings: Settings, engine_ready: Callable[[], Awaitable[bool]], manages: bool = True) -> None:
        self.settings = settings
        # Whether this process loads and unloads (a sidecar's worker 0); the others only see what the
        # engine lists, so one adapter is never loaded twice at once.
        self.manages = manages
        self.enabled = settings.adapter_api != AdapterApi.NONE
        self.routes = ENGINE_ROUTES.get(settings.adapter_api)
        self.file = settings.adapters_dir / ADAPTERS_KEY
        self.engine_ready = engine_ready
        self.session: aiohttp.ClientSession | None = None  # the app's lifespan opens it
        self.desired: tuple[Desired, ...] = ()
        # The request's `model` -> what the engine is asked for (SGLang: <base>:<adapter>).
        self.engine_names: Mapping[str, str] = MappingProxyType({})
        # The other way round, for the metrics' model label: made with the list, not per request.
        self.adapter_names: Mapping[str, str] = MappingProxyType({})
        self._states: dict[str, AdapterState] = {}
        self._loaded_from: dict[str, str] = {}  # name -> source this process loaded it from
        self._refused_at: dict[Desired, float] = {}
        if self.enabled:
            self.set_desired(read_desired(self.file) or ())

    def states(self) -> list[AdapterState]:
        return [self._states[d.name] for d in self.desired if d.name in self._states]

    def settled(self) -> bool:
        """Every wanted adapter loaded or refused (nothing to wait for without adapters)."""
        return not self.enabled or all(state.phase != Phase.PENDING for state in self.states())

    def names(self) -> frozenset[str]:
        return frozenset(d.name for d in self.desired)

    def set_desired(self, desired: tuple[Desired, ...]) -> None:
        if desired == self.desired:
            return
        self.desired = desired
        log.info("adapters wanted: %s", ", ".join(f"{d.name}={d.source}" for d in desired) or "none")
        served = self.settings.served_model
        prefixed = self.routes is not None and self.routes.base_prefixed
        self.engine_names = MappingProxyType({d.name: f"{served}:{d.name}" if prefixed else d.name for d in desired})
        self.adapter_names = MappingProxyType({engine: name for name, engine in self.engine_names.items()})
        for d in desired:
            if d.name not in self._states or self._states[d.name].source != d.source:
                self._states[d.name] = AdapterState(d.name, d.source, Phase.PENDING, "waiting for the engine")

    async def watch(self) -> None:
        """Until cancelled: read the list, and when the engine is ready bring it in line."""
        while True:
            desired = read_desired(self.file)
            if desired is not None:
                self.set_desired(desired)
            try:
                if await self.engine_ready():
                    await self.reconcile()
            except (TimeoutError, aiohttp.ClientError, ValueError, OSError) as exc:
                # Next round tries again: the loop lives as long as the sidecar.
                log.warning("adapter round failed: %s", type(exc).__name__)
            await asyncio.sleep(POLL_SECONDS)

    async def reconcile(self) -> None:
        """One round: unload what is no longer wanted, load what is missing (in the list's order)."""
        listed = await self._listed_adapters()
        if listed is None:
            return
        if not self.manages:
            for d in self.desired:
                if d.name in listed and self._states[d.name].phase != Phase.LOADED:
                    self._states[d.name] = AdapterState(d.name, d.source, Phase.LOADED, "loaded")
            return
        wanted = {d.name: d for d in self.desired}
        for name in sorted(listed - set(wanted)):
            await self._unload(name)
        for d in self.desired:
            if d.name in listed and self._loaded_from.get(d.name, d.source) == d.source:
                if self._states[d.name].phase != Phase.LOADED:  # loaded by an earlier sidecar process
                    self._states[d.name] = AdapterState(d.name, d.source, Phase.LOADED, "loaded")
                continue
            if d.name in listed:  # its source changed: the new weights replace the old
                await self._unload(d.name)
            refused = self._refused_at.get(d)
            if refused is not None and monotonic() - refused < RETRY_SECONDS:
                continue
            await self._load(d)

    async def _listed_adapters(self) -> set[str] | None:
        assert self.session is not None
        async with self.session.get(self.settings.upstream_url + "/v1/models", timeout=LIST_TIMEOUT) as answer:
            if answer.status != 200:
                return None
            listed = set(listed_models(await answer.json(content_type=None)))
        # SGLang lists an adapter by its name too; the base is the served name.
        return listed - {self.settings.engine_model}

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        assert self.session is not None
        async with self.session.post(
            self.settings.upstream_url + path,
            data=json.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=LOAD_TIMEOUT,
        ) as answer:
            return answer.status, await answer.text()

    async def _load(self, d: Desired) -> None:
        assert self.routes is not None
        start = perf_counter()
        status, text = await self._post(self.routes.load, {"lora_name": d.name, "lora_path": d.source})
        seconds = perf_counter() - start
        if status == 200:
            self._loaded_from[d.name] = d.source
            self._refused_at.pop(d, None)
            self._states[d.name] = AdapterState(d.name, d.source, Phase.LOADED, "loaded", round(seconds, 3))
            log.info("adapter %s loaded from %s in %.3f s", d.name, d.source, seconds)
            return
        message = engine_message(status, text)
        self._refused_at[d] = monotonic()
        self._states[d.name] = AdapterState(d.name, d.source, Phase.FAILED, message)
        log.warning("adapter %s from %s refused (%d): %s", d.name, d.source, status, message)

    async def _unload(self, name: str) -> None:
        assert self.routes is not None
        status, text = await self._post(self.routes.unload, {"lora_name": name})
        self._loaded_from.pop(name, None)
        if status == 200:
            log.info("adapter %s unloaded", name)
            if name not in self.names():
                self._states.pop(name, None)
        else:
            log.warning("unloading adapter %s answered %d: %s", name, status, engine_message(status, text))
