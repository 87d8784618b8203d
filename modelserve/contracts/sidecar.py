"""The contract between the operator and the sidecar: the sidecar's settings and their environment.

Both sides import this module and nothing else of each other: the operator builds `Settings` for a
pod and renders them with `to_env()`; the sidecar reads them back with `from_env()`, validated
before anything starts. Each setting's variable name, default, parser and rendering are written
once, on its field. Standard library only: the sidecar image carries no Kubernetes client.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import pod_urls
from .adapters import ADAPTERS_DIR, ADAPTERS_ROUTE, AdapterApi
from .env import (
    base_url,
    boolean,
    default_of,
    env_setting,
    non_empty,
    non_negative_float,
    non_negative_int,
    path,
    port,
    positive_float,
    positive_int,
    read_env,
    render_bool,
    render_number,
    route,
)
from .names import SIDECAR_NAME

# The operator-sidecar contract's version. An operator upgrade keeps running pods on their sidecar
# (upgradePolicy Manual), so release N's operator manages sidecars of release N-1. The rule:
# - N reads only what N-1 serves: the routes below and PodLoad's fields; new fields are optional;
# - N renders into a pod no variable that N-1 does not read, but at its default (OMITTED_AT_DEFAULT),
#   which leaves it out of the pod (a pod made before the images were recorded may meet N's rendering);
# - a route, field or variable N-1 relies on is removed or changes meaning only with CONTRACT_VERSION
#   raised, and only once no supported sidecar (this version and the one before) relies on it.
# Each release's record (`record()`, written by `make generate`) is kept in tests/fixtures/sidecar-contract/.
CONTRACT_VERSION = 1
LISTEN_PORT = 8080
KEYS_DIR = "/etc/modelserve/keys"
# The number of the ModelServer's ready replicas, which the operator keeps in an annotation of each
# pod and the kubelet mirrors into this file (a downward API volume): each sidecar enforces its share
# of a key's limits. Absent or empty: 1.
REPLICAS_FILE = "/etc/modelserve/replicas/count"
# The sidecar's own routes: the operator points the kubelet's probes at them.
HEALTH_ROUTE = "/healthz"
READY_ROUTE = "/readyz"
METRICS_ROUTE = "/metrics"
# What the operator's autoscaler reads from each pod: requests in flight and when the last one
# arrived, as JSON (`PodLoad`); no key needed, like the probes (it carries no request content).
LOAD_ROUTE = "/load"
# What the engine's preStop asks (the kubelet, as the pod is deleted): answered once the sidecar is done
# with the pod (told to stop, and nothing in flight in any of its workers, or its drain's end), so the
# engine stops then, not a fixed drain budget later.
DRAINED_ROUTE = "/drained"
OWN_ROUTES = frozenset({HEALTH_ROUTE, READY_ROUTE, METRICS_ROUTE, LOAD_ROUTE, ADAPTERS_ROUTE, DRAINED_ROUTE})
# Where a ModelServer's spec.tls Secret (kubernetes.io/tls) is mounted: the sidecar then serves HTTPS
# on its one port, which is named TLS_PORT_NAME, so its readers (the gateway, the operator) know.
TLS_DIR = "/etc/modelserve/tls"
TLS_PORT_NAME = pod_urls.TLS_PORT_NAME


def serves_tls(pod: Mapping[str, Any]) -> bool:
    """Whether a model pod's sidecar serves HTTPS (its port is named TLS_PORT_NAME)."""
    return pod_urls.serves_tls(pod, SIDECAR_NAME)


def base_of(pod: Mapping[str, Any]) -> str:
    """A model pod's sidecar: `https://IP:PORT` when it serves HTTPS, else `IP:PORT` (plain HTTP; what
    the gateway's replicas were named before TLS)."""
    return pod_urls.pod_base(pod, SIDECAR_NAME, LISTEN_PORT)


@dataclass(frozen=True)
class PodLoad:
    in_flight: int
    arrivals: int  # requests let through since the sidecar started
    seconds_since_arrival: float | None  # None: none yet

    def to_json(self) -> dict[str, Any]:
        return {
            "inFlight": self.in_flight,
            "arrivals": self.arrivals,
            "secondsSinceArrival": self.seconds_since_arrival,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> PodLoad:
        since = body["secondsSinceArrival"]
        return cls(int(body["inFlight"]), int(body["arrivals"]), None if since is None else float(since))

    @classmethod
    def total(cls, loads: Sequence[PodLoad]) -> PodLoad:
        """Several processes' loads as one pod's (a sidecar's workers): summed, the latest arrival."""
        since = [load.seconds_since_arrival for load in loads if load.seconds_since_arrival is not None]
        return cls(
            sum(load.in_flight for load in loads), sum(load.arrivals for load in loads), min(since, default=None)
        )


# The sampling fields the sidecar may fill in, by their request (snake_case) names: the
# ModelServer spec's `samplingDefaults` has exactly these (a test holds the two together).
SAMPLING_FIELDS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "max_tokens": int,
    "stop": list,  # of strings
}


def _is_public(raw: str) -> bool:
    if raw not in ("private", "public"):
        raise ValueError("must be 'private' or 'public'")
    return raw == "public"


def _sampling(raw: str) -> Mapping[str, Any]:
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
        if SAMPLING_FIELDS[name] is list:
            if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
                raise ValueError(f"{name} must be a list of non-empty strings")
            continue
        # bool is an int subclass; a `true` temperature is a mistake, not 1.0.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number")
        if SAMPLING_FIELDS[name] is int and not float(value).is_integer():
            raise ValueError(f"{name} must be an integer")
    if data.get("max_tokens", 1) <= 0:
        raise ValueError("max_tokens must be positive")
    return MappingProxyType({k: SAMPLING_FIELDS[k](v) for k, v in data.items()})


def _aliases(raw: str) -> Mapping[str, str]:
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) and v for v in data.values()):
        raise ValueError('must be a JSON object of field names, e.g. {"repetition_penalty": "repeat_penalty"}')
    unknown = sorted(set(data) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(SAMPLING_FIELDS)}")
    return MappingProxyType(dict(data))


def _render_auth(public: bool) -> str:
    return "public" if public else "private"


def _render_sampling(values: Mapping[str, Any]) -> str:
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"))


# The bounds on a client's connection (modelserve/http/limits.py): the operator's settings of the same
# names, MODELSERVE_SIDECAR_*, give every pod's (contracts/operator_settings.py; the chart's
# sidecar.clientLimits).
CLIENT_LIMITS = (
    "max_head_bytes",
    "max_header_fields",
    "head_timeout_seconds",
    "body_timeout_seconds",
    "max_connections",
    "body_budget_bytes",
    "send_timeout_seconds",
)

# Left out of a pod's environment at their defaults: settings added after release 0.1 (a new
# variable in every pod template would roll every pod, GPU cold starts included, on an upgrade)
# and the empty ones.
OMITTED_AT_DEFAULT = frozenset(
    {
        "sampling_defaults",
        "sampling_aliases",
        "upstream_model",
        "engine_metrics",
        "adapter_api",
        "adapters_dir",
        "engine_concurrency",
        "replicas_file",
        "workers",
        "tls_dir",
        *CLIENT_LIMITS,
    }
)


@dataclass(frozen=True)
class Settings:
    """Everything the sidecar runs with; each field is one MODELSERVE_* variable."""

    # The engine's base URL: on the pod's loopback (e.g. http://127.0.0.1:8000), or, for profile
    # external, the external server's root.
    upstream_url: str = env_setting("MODELSERVE_UPSTREAM_URL", base_url)
    # The name clients put in `model`: the ModelServer's name.
    served_model: str = env_setting("MODELSERVE_SERVED_MODEL", non_empty)
    # The address the sidecar listens on.
    listen_host: str = env_setting("MODELSERVE_LISTEN_HOST", non_empty, default="0.0.0.0")
    # The pod's one port (`http`), the Service's target.
    listen_port: int = env_setting("MODELSERVE_LISTEN_PORT", port, default=LISTEN_PORT)
    # A directory holding a certificate chain `tls.crt` (leaf first) and its key `tls.key`, a mounted
    # kubernetes.io/tls Secret (spec.tls): the sidecar serves HTTPS (TLS 1.2 and later) on its port,
    # and a renewed pair within about a second of the files changing. Empty: plain HTTP.
    tls_dir: Path | None = env_setting("MODELSERVE_TLS_DIR", path, default=None)  # noqa: RUF009 - immutable
    # The engine's health route, which readiness asks before the model list.
    engine_health_path: str = env_setting("MODELSERVE_ENGINE_HEALTH_PATH", route, default="/health")
    # The engine's Prometheus route, whose series follow the sidecar's own on /metrics.
    engine_metrics_path: str = env_setting("MODELSERVE_ENGINE_METRICS_PATH", route, default="/metrics")
    # Whether the upstream serves Prometheus metrics at all (an external Ollama or MLX server has none).
    engine_metrics: bool = env_setting("MODELSERVE_ENGINE_METRICS", boolean, render_bool, default=True)
    # The model id the upstream serves when it is not the served name (an external server's own
    # name, e.g. llama3.2:1b): requests are sent with it, and readiness looks for it. Empty: the
    # engine serves under the served name.
    upstream_model: str = env_setting("MODELSERVE_UPSTREAM_MODEL", non_empty, default="")
    # How long the engine may take to answer its health route and model list before it counts as
    # unreachable; the operator sets it per engine (SGLang's health route may generate a token).
    engine_probe_timeout_seconds: float = env_setting(
        "MODELSERVE_ENGINE_PROBE_TIMEOUT_SECONDS", positive_float, render_number, default=5.0
    )
    # private: every request needs an API key; public: none (spec.auth.mode).
    auth_public: bool = env_setting("MODELSERVE_AUTH", _is_public, _render_auth, default=False)
    # The mounted key Secret: each file one named key entry, re-read when the kubelet updates it.
    keys_dir: Path = env_setting("MODELSERVE_KEYS_DIR", path, default=Path(KEYS_DIR))  # noqa: RUF009 - immutable
    # Whether /metrics answers without a key.
    metrics_public: bool = env_setting("MODELSERVE_METRICS_PUBLIC", boolean, render_bool, default=True)
    # The model takes image parts (spec.vision); otherwise the sidecar refuses every media part.
    vision: bool = env_setting("MODELSERVE_VISION", boolean, render_bool, default=False)
    # Sampling values filled into a request that leaves them out (spec.samplingDefaults), a JSON
    # object in the OpenAI API's names (temperature, top_p, max_tokens, stop, ...).
    sampling_defaults: Mapping[str, Any] = env_setting(
        "MODELSERVE_SAMPLING_DEFAULTS",
        _sampling,
        _render_sampling,
        default_factory=lambda: MappingProxyType({}),
    )
    # The engine's own name of a sampling field it reads under no other (llama.cpp's server reads
    # repeat_penalty, never repetition_penalty): the sidecar copies the value there too.
    sampling_aliases: Mapping[str, str] = env_setting(
        "MODELSERVE_SAMPLING_ALIASES",
        _aliases,
        _render_sampling,
        default_factory=lambda: MappingProxyType({}),
    )
    # The largest request body in bytes; beyond it, 413 body_too_large.
    max_body_bytes: int = env_setting("MODELSERVE_MAX_BODY_BYTES", positive_int, default=10 * 1024 * 1024)
    # JSON values a second one key's bodies may have read on the event loop (about a fifth of a core
    # at the default); past it they are read in the helper process (http/loop_share.py).
    loop_share_values_per_second: int = env_setting(
        "MODELSERVE_LOOP_SHARE_VALUES_PER_SECOND", positive_int, default=200_000
    )
    # How long the engine may stay silent (connecting, or between two reads) before the request
    # ends with 504 engine_timeout; also the longest wait for an engine slot.
    upstream_timeout_seconds: float = env_setting(
        "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS", positive_float, render_number, default=600.0
    )
    # SIGTERM's drain deadline for in-flight streams.
    drain_seconds: float = env_setting("MODELSERVE_DRAIN_SECONDS", non_negative_float, render_number, default=60.0)
    # Connections to the engine, at least engine_concurrency (so the engine's whole batch reaches it);
    # not aiohttp's default 100.
    upstream_max_connections: int = env_setting("MODELSERVE_UPSTREAM_MAX_CONNECTIONS", positive_int, default=1024)
    # Requests the engine is given at once: what it batches (--max-num-seqs, --max-running-requests,
    # llama.cpp's slots, or the version's default; Engine.batch_size), for an external server the
    # ModelServer's targetPerReplica. More wait in the sidecar, served across keys in turn
    # (sidecar/fair_share.py), rather than in the engine's own queue, first come first served. 0: no bound.
    engine_concurrency: int = env_setting("MODELSERVE_ENGINE_CONCURRENCY", non_negative_int, default=0)
    # The downward API file holding the ModelServer's ready replicas (serving-replicas annotation),
    # re-read every second: each sidecar enforces 1/N of a key's limits.
    replicas_file: Path = env_setting(  # noqa: RUF009 - immutable
        "MODELSERVE_REPLICAS_FILE", path, default=Path(REPLICAS_FILE)
    )
    # Processes relaying on the one port (http/workers.py): one core carries about 40k token events/s,
    # so a pod fed by fast GPUs needs several. They share a key's limits and the engine's slots
    # (sidecar/pod_counts.py); worker 0 answers the pod's own routes for all of them.
    workers: int = env_setting("MODELSERVE_WORKERS", positive_int, default=1)

    # LoRA adapters: which engine API loads them (none: the ModelServer has no adapters), and the
    # directory of the mounted ConfigMap listing them (contracts/adapters.py).
    adapter_api: AdapterApi = env_setting(  # noqa: RUF009 - immutable
        "MODELSERVE_ADAPTER_API", AdapterApi, str, default=AdapterApi.NONE
    )
    adapters_dir: Path = env_setting(  # noqa: RUF009 - immutable
        "MODELSERVE_ADAPTERS_DIR", path, default=Path(ADAPTERS_DIR)
    )

    # What one client connection may take before any check (modelserve/http/limits.py): the request
    # head in bytes and fields (431), the head's and the body's deadlines (408), connections per
    # process (within the open-file limit), and the bytes of request bodies still arriving (503).
    max_head_bytes: int = env_setting("MODELSERVE_MAX_HEAD_BYTES", positive_int, default=32 * 1024)
    max_header_fields: int = env_setting("MODELSERVE_MAX_HEADER_FIELDS", positive_int, default=100)
    head_timeout_seconds: float = env_setting(
        "MODELSERVE_HEAD_TIMEOUT_SECONDS", positive_float, render_number, default=15.0
    )
    body_timeout_seconds: float = env_setting(
        "MODELSERVE_BODY_TIMEOUT_SECONDS", positive_float, render_number, default=60.0
    )
    max_connections: int = env_setting("MODELSERVE_MAX_CONNECTIONS", positive_int, default=4096)
    body_budget_bytes: int = env_setting("MODELSERVE_BODY_BUDGET_BYTES", positive_int, default=64 * 1024 * 1024)
    # An answer its client does not read (408's cousin: the connection is cut, not answered).
    send_timeout_seconds: float = env_setting(
        "MODELSERVE_SEND_TIMEOUT_SECONDS", positive_float, render_number, default=60.0
    )

    @property
    def engine_model(self) -> str:
        """The model id the upstream lists and is asked for."""
        return self.upstream_model or self.served_model

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from `MODELSERVE_*` variables; raise ConfigError naming the bad one."""
        return read_env(cls, env)

    def to_env(self) -> dict[str, str]:
        """Every setting as its variable, so a pod's spec shows all the sidecar runs with, but the
        keys directory with public auth (it means nothing) and OMITTED_AT_DEFAULT at their defaults."""
        env = {}
        for setting in dataclasses.fields(self):
            value = getattr(self, setting.name)
            if (setting.name == "keys_dir" and self.auth_public) or (
                setting.name in OMITTED_AT_DEFAULT and value == default_of(setting)
            ):
                continue
            env[setting.metadata["env"]] = setting.metadata["render"](value)
        return env


def record() -> dict[str, Any]:
    """This release's side of the contract, as the N-1 tests of the next release read it."""
    return {
        "contract": CONTRACT_VERSION,
        "variables": sorted(setting.metadata["env"] for setting in dataclasses.fields(Settings)),
        "routes": sorted(OWN_ROUTES),
        "load": PodLoad(in_flight=3, arrivals=17, seconds_since_arrival=1.5).to_json(),
    }
