"""One module per engine, chosen by the ModelServer's profile; each makes one `Engine`."""

from __future__ import annotations

from modelserve.contracts.choices import Profile

from . import llamacpp, sglang, vllm
from .base import Engine

ENGINES: dict[Profile, Engine] = {
    Profile.HIGH_THROUGHPUT: vllm.ENGINE,
    Profile.LOW_LATENCY: sglang.ENGINE,
    Profile.CPU: llamacpp.ENGINE,
}


def engine_for(profile: Profile) -> Engine:
    """The engine serving a profile."""
    return ENGINES[profile]
