"""Settings read from the environment, one way for every program: a frozen dataclass whose fields
are `env_setting`s (variable, parser, rendering, default), read by `read_env`, which names the
variable in every error. A program reads its settings with `settings_or_exit` (status 2 on a bad
one) and lists them in --help with `variables_help`."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the environment variable."""


def non_empty(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def base_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    return raw.rstrip("/")


def route(raw: str) -> str:
    if not raw.startswith("/"):
        raise ValueError("must be a path starting with '/'")
    return raw


def number(raw: str, kind: type[T]) -> T:
    try:
        return kind(raw)  # type: ignore[call-arg]
    except ValueError:
        raise ValueError(f"must be {'an integer' if kind is int else 'a number'}") from None


def port(raw: str) -> int:
    value = number(raw, int)
    if not 0 < value < 65536:
        raise ValueError("must be a port number between 1 and 65535")
    return value


def port_or_off(raw: str) -> int:
    """A port, or 0 for a listener that is off."""
    return 0 if number(raw, int) == 0 else port(raw)


def boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("must be true or false")


def positive_int(raw: str) -> int:
    value = number(raw, int)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def non_negative_int(raw: str) -> int:
    value = number(raw, int)
    if value < 0:
        raise ValueError("must be zero or a positive integer")
    return value


def positive_float(raw: str) -> float:
    value = number(raw, float)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def non_negative_float(raw: str) -> float:
    value = number(raw, float)
    if not value >= 0:
        raise ValueError("must be zero or a positive number")
    return value


_BYTE_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def byte_quantity(raw: str) -> int:
    """Bytes from a Kubernetes quantity in bytes' units (`50Gi`, `500M`, `1073741824`)."""
    number_text = raw.rstrip("kKMGTi")
    unit = raw[len(number_text) :]
    if unit not in _BYTE_UNITS or not number_text:
        raise ValueError("must be a number of bytes such as 50Gi, 500M or 1073741824")
    value = number(number_text, float) * _BYTE_UNITS[unit]
    if value <= 0:
        raise ValueError("must be more than 0 bytes")
    return int(value)


def path(raw: str) -> Path:
    return Path(non_empty(raw))


def comma_list(raw: str) -> tuple[str, ...]:
    """Comma-separated values, blanks dropped, in the order given."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def render_number(value: float) -> str:
    return f"{value:g}"


def render_bool(value: bool) -> str:
    return "true" if value else "false"


def env_setting(
    env: str,
    parse: Callable[[str], Any],
    render: Callable[[Any], str] = str,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    deprecated_env: str | None = None,
) -> Any:
    """A field of a settings dataclass with its variable, how to read it and how to write it.
    `deprecated_env`: the variable's former name, still read (with a warning) when `env` is unset."""
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={"env": env, "parse": parse, "render": render, "deprecated_env": deprecated_env},
    )


def env_map(prefix: str, parse: Callable[[str], Any], key: str = "NAME") -> Any:
    """A field of a settings dataclass read from a family of variables, `prefix` + a name each:
    a dict by the names in lower case (MODELSERVE_ENGINE_IMAGE_VLLM=x -> {"vllm": "x"}), so a
    new name needs no new field. Blank variables are left out, as unset ones."""
    return dataclasses.field(
        default_factory=dict,
        metadata={"env": f"{prefix}<{key}>", "prefix": prefix, "parse": parse, "render": str, "deprecated_env": None},
    )


def _read_map(setting: dataclasses.Field, env: Mapping[str, str]) -> dict[str, Any]:
    prefix: str = setting.metadata["prefix"]
    values = {}
    for name in sorted(env):
        raw = (env.get(name) or "").strip()
        if not (name.startswith(prefix) and len(name) > len(prefix) and raw):
            continue
        try:
            values[name.removeprefix(prefix).lower()] = setting.metadata["parse"](raw)
        except ValueError as exc:
            raise ConfigError(f"{name}={env[name]!r}: {exc}") from None
    return values


def default_of(setting: dataclasses.Field) -> Any:
    if setting.default_factory is not dataclasses.MISSING:
        return setting.default_factory()
    return setting.default


def _variable(setting: dataclasses.Field, env: Mapping[str, str]) -> str:
    """Which variable holds the setting: its name, or its deprecated name when only that is set."""
    name: str = setting.metadata["env"]
    old = setting.metadata.get("deprecated_env")
    if old and not (env.get(name) or "").strip() and (env.get(old) or "").strip():
        log.warning("%s is deprecated and will be removed in the next release: set %s instead", old, name)
        return old
    return name


def read_env(cls: type[T], env: Mapping[str, str]) -> T:
    """An instance of the dataclass `cls` whose fields are `env_setting`s, read from `env`; raise
    ConfigError naming the variable that is missing or bad."""
    values = {}
    for setting in dataclasses.fields(cls):  # type: ignore[arg-type]
        if setting.metadata.get("prefix"):
            values[setting.name] = _read_map(setting, env)
            continue
        name = _variable(setting, env)
        raw = (env.get(name) or "").strip()
        if raw:
            try:
                values[setting.name] = setting.metadata["parse"](raw)
            except ValueError as exc:
                raise ConfigError(f"{name}={env[name]!r}: {exc}") from None
        elif setting.default is dataclasses.MISSING and setting.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{name} is required")
    return cls(**values)


def variables(settings: type) -> dict[str, str]:
    """Each variable of a settings dataclass and the field it sets."""
    return {setting.metadata["env"]: setting.name for setting in dataclasses.fields(settings)}


def variables_help(settings: type) -> str:
    """The variables of a settings dataclass, one per line, for --help."""
    return "\n".join(f"  {name}" for name in variables(settings))


def settings_or_exit(settings: type[T], prog: str) -> T:
    """The settings from this process's environment; a bad one ends it with status 2, naming it."""
    try:
        return read_env(settings, os.environ)
    except ConfigError as exc:
        print(f"{prog}: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
