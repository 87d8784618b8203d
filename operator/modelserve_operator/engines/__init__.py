"""One module per engine, chosen by the ModelServer's profile."""

from __future__ import annotations

from types import ModuleType

from ..choices import Profile
from . import llamacpp, sglang, vllm

ENGINES: dict[Profile, ModuleType] = {
    Profile.HIGH_THROUGHPUT: vllm,
    Profile.LOW_LATENCY: sglang,
    Profile.CPU: llamacpp,
}


def engine_for(profile: Profile) -> ModuleType:
    """The engine module serving a profile: it has FACTS and container(ms, image, drain_seconds, hub_endpoint)."""
    return ENGINES[profile]
