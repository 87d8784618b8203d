"""The sidecar's settings, read once from the environment and validated before anything starts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

# The sampling fields the sidecar may fill in (the ModelServer spec's `samplingDefaults`).
SAMPLING_FIELDS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "max_tokens": int,
}


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the environment variable."""


@dataclass(frozen=True)
class Settings:
    upstream_url: str
    served_model: str
    listen_host: str = "0.0.0.0"
    listen_port: int = 8080
    engine_health_path: str = "/health"
    engine_metrics_path: str = "/metrics"
    # How long the engine may take to answer its health route and model list before it counts as
    # unreachable; the operator sets it per engine (SGLang's health route may generate a token).
    engine_probe_timeout_seconds: float = 5.0
    auth_public: bool = False
    keys_dir: Path = Path("/etc/modelserve/keys")
    metrics_public: bool = True
    vision: bool = False
    sampling_defaults: Mapping[str, float | int] = field(default_factory=lambda: MappingProxyType({}))
    max_body_bytes: int = 10 * 1024 * 1024
    upstream_timeout_seconds: float = 600.0
    drain_seconds: float = 60.0
    # Connections to the engine; sized for an engine's concurrency (vLLM queues beyond its
    # max-num-seqs itself, where its own metrics show the wait), not aiohttp's default 100.
    upstream_max_connections: int = 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from `MODELSERVE_*` variables; raise ConfigError naming the bad one."""
        return cls(
            upstream_url=_read(env, "MODELSERVE_UPSTREAM_URL", None, _base_url),
            served_model=_read(env, "MODELSERVE_SERVED_MODEL", None, _non_empty),
            listen_host=_read(env, "MODELSERVE_LISTEN_HOST", "0.0.0.0", _non_empty),
            listen_port=_read(env, "MODELSERVE_LISTEN_PORT", "8080", _port),
            engine_health_path=_read(env, "MODELSERVE_ENGINE_HEALTH_PATH", "/health", _route),
            engine_metrics_path=_read(env, "MODELSERVE_ENGINE_METRICS_PATH", "/metrics", _route),
            engine_probe_timeout_seconds=_read(env, "MODELSERVE_ENGINE_PROBE_TIMEOUT_SECONDS", "5", _positive_float),
            auth_public=_read(env, "MODELSERVE_AUTH", "private", _auth_mode) == "public",
            keys_dir=Path(_read(env, "MODELSERVE_KEYS_DIR", "/etc/modelserve/keys", _non_empty)),
            metrics_public=_read(env, "MODELSERVE_METRICS_PUBLIC", "true", _bool),
            vision=_read(env, "MODELSERVE_VISION", "false", _bool),
            sampling_defaults=_read(env, "MODELSERVE_SAMPLING_DEFAULTS", "{}", _sampling),
            max_body_bytes=_read(env, "MODELSERVE_MAX_BODY_BYTES", str(10 * 1024 * 1024), _positive_int),
            upstream_timeout_seconds=_read(env, "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS", "600", _positive_float),
            drain_seconds=_read(env, "MODELSERVE_DRAIN_SECONDS", "60", _non_negative_float),
            upstream_max_connections=_read(env, "MODELSERVE_UPSTREAM_MAX_CONNECTIONS", "1024", _positive_int),
        )


def _read(env: Mapping[str, str], name: str, default: str | None, parse: Callable[[str], T]) -> T:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ConfigError(f"{name} is required")
        raw = default
    try:
        return parse(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None


def _non_empty(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def _base_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    return raw.rstrip("/")


def _route(raw: str) -> str:
    if not raw.startswith("/"):
        raise ValueError("must be a path starting with '/'")
    return raw


def _number(raw: str, kind: type[T]) -> T:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"must be {'an integer' if kind is int else 'a number'}") from None


def _port(raw: str) -> int:
    port = _number(raw, int)
    if not 0 < port < 65536:
        raise ValueError("must be a port number between 1 and 65535")
    return port


def _auth_mode(raw: str) -> str:
    if raw not in ("private", "public"):
        raise ValueError("must be 'private' or 'public'")
    return raw


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("must be true or false")


def _positive_int(raw: str) -> int:
    value = _number(raw, int)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _positive_float(raw: str) -> float:
    value = _number(raw, float)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def _non_negative_float(raw: str) -> float:
    value = _number(raw, float)
    if not value >= 0:
        raise ValueError("must be zero or a positive number")
    return value


def _sampling(raw: str) -> Mapping[str, float | int]:
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    unknown = sorted(set(data) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(SAMPLING_FIELDS)}")
    for name, value in data.items():
        # bool is an int subclass; a `true` temperature is a mistake, not 1.0.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number")
        if SAMPLING_FIELDS[name] is int and not float(value).is_integer():
            raise ValueError(f"{name} must be an integer")
    if data.get("max_tokens", 1) <= 0:
        raise ValueError("max_tokens must be positive")
    return MappingProxyType({k: SAMPLING_FIELDS[k](v) for k, v in data.items()})
