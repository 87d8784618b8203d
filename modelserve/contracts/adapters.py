"""LoRA adapters between the operator and the sidecar: the desired list the operator writes into
the ModelServer's ConfigMap (mounted into the sidecar, so a change reaches a running pod without a
restart), and the state per adapter the sidecar reports on its own route for the operator's status.

Standard library only: both programs import it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

ADAPTERS_DIR = "/etc/modelserve/adapters"
ADAPTERS_KEY = "adapters.json"
# The sidecar's own route (no key, like /load: names, sources and states, no request content).
ADAPTERS_ROUTE = "/adapters"


class AdapterApi(StrEnum):
    """Which engine's administration API loads adapters at run time; NONE: no adapters."""

    NONE = "none"
    VLLM = "vllm"
    SGLANG = "sglang"


class Phase(StrEnum):
    PENDING = "Pending"  # desired, not loaded yet (engine still starting, or loading)
    LOADED = "Loaded"
    FAILED = "Failed"  # the engine refused it: its message says why


@dataclass(frozen=True)
class Desired:
    """One adapter the ModelServer asks for: served as `name`, loaded from `source` (a hub id or a
    path in the cache volume)."""

    name: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "source": self.source}


def render_desired(adapters: list[Desired]) -> str:
    """The ConfigMap's text: the same list always gives the same bytes."""
    return json.dumps([adapter.to_json() for adapter in adapters], sort_keys=True, separators=(",", ":"))


def parse_desired(text: str) -> tuple[Desired, ...]:
    """The list back; raises ValueError on anything but a list of {name, source} strings."""
    data: Any = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("adapters must be a JSON list")
    out = []
    for item in data:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("source"), str)):
            raise ValueError(f"not an adapter: {item!r}")
        out.append(Desired(item["name"], item["source"]))
    return tuple(out)


@dataclass(frozen=True)
class AdapterState:
    """One adapter as one sidecar sees it in its engine."""

    name: str
    source: str
    phase: Phase
    message: str = ""
    load_seconds: float | None = None  # how long the engine took to load it (the last time)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "phase": self.phase.value,
            "message": self.message,
            "loadSeconds": self.load_seconds,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> AdapterState:
        seconds = body.get("loadSeconds")
        return cls(
            str(body["name"]),
            str(body["source"]),
            Phase(body["phase"]),
            str(body.get("message") or ""),
            None if seconds is None else float(seconds),
        )


@dataclass(frozen=True)
class EngineAdapterRoutes:
    """An engine's administration routes for adapters, on 127.0.0.1 in the pod (its own bodies:
    load {lora_name, lora_path}, unload {lora_name}, the same in both engines)."""

    load: str
    unload: str
    # How a request names an adapter: vLLM by its name in `model`; SGLang 0.5.23 reads `model` as
    # `<base>:<adapter>` (entrypoints/openai/serving_base.py) and ignores a bare adapter name.
    base_prefixed: bool


ENGINE_ROUTES = {
    AdapterApi.VLLM: EngineAdapterRoutes("/v1/load_lora_adapter", "/v1/unload_lora_adapter", base_prefixed=False),
    AdapterApi.SGLANG: EngineAdapterRoutes("/load_lora_adapter", "/unload_lora_adapter", base_prefixed=True),
}
