"""The engine registry: one line per engine module, each making one `Engine`. The spec's profiles,
the CRD's rules (api/engine_rules.py) and the operator's engine image settings all follow from it."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from . import external, llamacpp, sglang, vllm
from .base import Engine

# One line per engine; the CRD lists their profiles in this order, profile external last.
REGISTRY: tuple[Engine, ...] = (
    vllm.ENGINE,
    sglang.ENGINE,
    llamacpp.ENGINE,
)


def _profile_enum(engines: Iterable[Engine]) -> type[StrEnum]:
    """The spec's profiles as an enumeration (Profile.HIGH_THROUGHPUT == "high-throughput", ...):
    each engine's, then external (no engine)."""
    engines = tuple(engines)
    for fact in ("profile", "name"):
        values = [getattr(engine, fact) for engine in engines]
        if len(set(values)) != len(values):
            raise ValueError(f"two engines share a {fact}: {values}")
        if external.PROFILE in values:
            raise ValueError(f"no engine's {fact} may be {external.PROFILE!r}: profile external runs none")
    values = [*(engine.profile for engine in engines), external.PROFILE]
    profile = StrEnum("Profile", [(value.upper().replace("-", "_"), value) for value in values], module=__name__)
    profile.__doc__ = "Deployment profile: which engine serves the model (external: none in the pod)."
    return profile


# Built from the registry, so a type checker sees a variable, not a class: fine, none runs here.
Profile = _profile_enum(REGISTRY)
ENGINES: dict[Profile, Engine] = {Profile(engine.profile): engine for engine in REGISTRY}  # type: ignore[valid-type]


def engine_for(profile: Profile) -> Engine:  # type: ignore[valid-type]
    """The engine serving a profile."""
    return ENGINES[profile]
