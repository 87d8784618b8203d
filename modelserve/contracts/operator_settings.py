"""The operator's settings, each one MODELSERVE_* variable, the engine images one per engine (the
chart sets them; `modelserve render` reads the same ones, to render what the operator would)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import sidecar
from .env import (
    ConfigError,
    base_url,
    boolean,
    comma_list,
    env_map,
    env_setting,
    non_empty,
    non_negative_float,
    number,
    port,
    read_env,
    render_bool,
)
from .names import PACKAGE_VERSION

# MODELSERVE_ENGINE_IMAGE_<engine name in upper case>: the chart's engines.<name>.image.
ENGINE_IMAGE_PREFIX = "MODELSERVE_ENGINE_IMAGE_"


def _seconds(raw: str) -> int:
    value = number(raw, int)
    if value < 0:
        raise ValueError("must be zero or a positive whole number of seconds")
    return value


def _metrics_port(raw: str) -> int:
    value = number(raw, int)
    if not 0 <= value < 65536:
        raise ValueError("must be a port number between 1 and 65535, or 0 for none")
    return value


def _addresses(raw: str) -> tuple[str, ...]:
    addresses = comma_list(raw)
    for address in addresses:
        host, _, port = address.removeprefix("https://").rpartition(":")
        if not host or not port.isdigit() or "/" in host:
            raise ValueError(f"{address!r} is not host:port or https://host:port")
    return addresses


# A Secret's name (a DNS-1123 subdomain), as the API server checks it.
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _secret_names(raw: str) -> tuple[str, ...]:
    names = comma_list(raw)
    for name in names:
        if len(name) > 253 or not _SECRET_NAME.match(name):
            raise ValueError(f"{name!r} is not a Secret name (lower case letters, digits, '-' and '.')")
    return tuple(dict.fromkeys(names))


def _lease(raw: str) -> str:
    namespace, _, name = raw.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError("must be <namespace>/<name> of a coordination.k8s.io Lease")
    return raw


def _lease_seconds(raw: str) -> float:
    value = non_negative_float(raw)
    if value < 3:
        raise ValueError("must be at least 3 seconds")
    return value


# A namespace or object name (a DNS-1123 label), as the API server checks a Service's.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _service_ref(raw: str) -> str:
    namespace, _, name = raw.partition("/")
    if not (_DNS_LABEL.match(namespace) and _DNS_LABEL.match(name)) or len(namespace) > 63 or len(name) > 63:
        raise ValueError("must be <namespace>/<name> of a Service")
    return raw


FAILURE_MODES = ("FailClose", "FailOpen")


def _failure_mode(raw: str) -> str:
    if raw not in FAILURE_MODES:
        raise ValueError(f"must be one of {', '.join(FAILURE_MODES)}")
    return raw


def _sidecars_setting(name: str, env: str | None = None) -> Any:
    """One of the sidecar's settings, read by the operator with the same parser and default (under
    the same variable, or `env`) to pass on to every pod's sidecar: one definition, one type."""
    setting = sidecar.Settings.__dataclass_fields__[name]
    metadata = setting.metadata if env is None else {**setting.metadata, "env": env}
    return dataclasses.field(default=setting.default, default_factory=setting.default_factory, metadata=metadata)


@dataclass(frozen=True)
class Settings:
    """What the operator needs besides the ModelServer itself."""

    # The sidecar image put in every model pod (the chart keeps it in step with the operator's).
    sidecar_image: str = env_setting(
        "MODELSERVE_SIDECAR_IMAGE", non_empty, default=f"ghcr.io/modelserve/modelserve:{PACKAGE_VERSION}"
    )
    # The sidecar's drain deadline (the sidecar's own MODELSERVE_DRAIN_SECONDS, a number of seconds);
    # the engine outlives it.
    drain_seconds: float = _sidecars_setting("drain_seconds")
    # Cold start budget (image pull + download + load).
    startup_seconds: int = env_setting("MODELSERVE_STARTUP_SECONDS", _seconds, default=3600)
    # Level-based resync of every ModelServer.
    resync_seconds: float = env_setting("MODELSERVE_RESYNC_SECONDS", non_negative_float, default=60.0)
    # For status.endpoint.
    cluster_domain: str = env_setting("MODELSERVE_CLUSTER_DOMAIN", non_empty, default="cluster.local")
    # A Hugging Face Hub mirror every engine downloads from (air-gapped clusters, the sandbox); set as
    # HF_ENDPOINT and llama.cpp's MODEL_ENDPOINT. Empty: the hub.
    hub_endpoint: str = env_setting("MODELSERVE_HUB_ENDPOINT", base_url, default="")
    # The node agents' Service (the chart's nodeCache): every model pod fetches its model through the
    # agent on its own node (an init container), so a model's bytes cross the network once per node.
    # Empty: no node cache, the engines download as they start.
    node_cache_url: str = env_setting("MODELSERVE_NODE_CACHE_URL", base_url, default="")
    # A mirror or a newer tag for every ModelServer of that engine, by engine name; a ModelServer's
    # own spec.image still wins. One variable per engine of the registry, named by its Engine
    # (Engine.image_env: MODELSERVE_ENGINE_IMAGE_<name in upper case>), so a new engine needs no field.
    engine_images: Mapping[str, str] = env_map(ENGINE_IMAGE_PREFIX, non_empty, key="ENGINE")
    # Secrets every model pod and prefetch Job pulls its images with (a private registry or mirror),
    # comma-separated names; each must exist in every namespace with ModelServers. A ModelServer's own
    # spec.imagePullSecrets come first.
    image_pull_secrets: tuple[str, ...] = env_setting("MODELSERVE_IMAGE_PULL_SECRETS", _secret_names, default=())
    # The operator's own /metrics; 0: not served.
    metrics_port: int = env_setting("MODELSERVE_METRICS_PORT", _metrics_port, default=0)
    # The gateway's base URL, written to every status.gatewayEndpoint.
    gateway_url: str = env_setting("MODELSERVE_GATEWAY_URL", base_url, default="")
    # Where the gateway's pods run: the autoscaler reads the requests they hold for ModelServers at
    # zero. Empty: no gateway pods. (Not the gateway's own MODELSERVE_GATEWAY_NAMESPACES, what it watches.)
    gateway_pod_namespace: str = env_setting(
        "MODELSERVE_GATEWAY_POD_NAMESPACE", non_empty, default="", deprecated_env="MODELSERVE_GATEWAY_NAMESPACE"
    )
    # host:port (https://host:port for one serving HTTPS) of gateways that are not pods (the sandbox
    # runs one on the host), comma-separated; their held requests count as well.
    gateway_addresses: tuple[str, ...] = env_setting("MODELSERVE_GATEWAY_ADDRESSES", _addresses, default=())

    # What one client connection may take of every pod's sidecar before any check (contracts/sidecar.py
    # CLIENT_LIMITS, modelserve/http/limits.py); at the sidecar's defaults they stay out of the pods.
    sidecar_max_head_bytes: int = _sidecars_setting("max_head_bytes", "MODELSERVE_SIDECAR_MAX_HEAD_BYTES")
    sidecar_max_header_fields: int = _sidecars_setting("max_header_fields", "MODELSERVE_SIDECAR_MAX_HEADER_FIELDS")
    sidecar_head_timeout_seconds: float = _sidecars_setting(
        "head_timeout_seconds", "MODELSERVE_SIDECAR_HEAD_TIMEOUT_SECONDS"
    )
    sidecar_body_timeout_seconds: float = _sidecars_setting(
        "body_timeout_seconds", "MODELSERVE_SIDECAR_BODY_TIMEOUT_SECONDS"
    )
    sidecar_max_connections: int = _sidecars_setting("max_connections", "MODELSERVE_SIDECAR_MAX_CONNECTIONS")
    sidecar_body_budget_bytes: int = _sidecars_setting("body_budget_bytes", "MODELSERVE_SIDECAR_BODY_BUDGET_BYTES")
    sidecar_send_timeout_seconds: float = _sidecars_setting(
        "send_timeout_seconds", "MODELSERVE_SIDECAR_SEND_TIMEOUT_SECONDS"
    )

    # Leader election: every replica campaigns for this Lease (<namespace>/<name>) and only its holder
    # reconciles, autoscales and wakes models at zero. Empty: no election (one replica only).
    leader_election_lease: str = env_setting("MODELSERVE_LEADER_ELECTION_LEASE", _lease, default="")
    # A leader silent this long is replaced (renewed every 2/15 of it, given up after 2/3 unrenewed).
    lease_seconds: float = env_setting("MODELSERVE_LEASE_SECONDS", _lease_seconds, default=15.0)

    # InferencePools (Gateway API Inference Extension v1): one per namespace of ModelServers, named
    # `modelserve`, selecting the pods that serve HTTP (which then carry a label: turning it on rolls
    # every model pod once), its endpoint picker modelserve's own. Off: no pool, no label, no CRD needed.
    inference_pools: bool = env_setting("MODELSERVE_INFERENCE_POOLS", boolean, render_bool, default=False)
    # The endpoint picker's Service, <namespace>/<name> (the chart's gateway), required with pools on:
    # each pool's namespace gets a selectorless Service and EndpointSlice with its ready endpoints, which
    # the pool's endpointPickerRef names (it may only name a Service of its own namespace).
    picker_service: str = env_setting("MODELSERVE_PICKER_SERVICE", _service_ref, default="")
    # The port of that Service the picker serves the endpoint picker protocol on (gRPC ext_proc).
    picker_port: int = env_setting("MODELSERVE_PICKER_PORT", port, default=9002)
    # What a data plane does when the picker does not answer: FailClose (refuse the request) or FailOpen.
    picker_failure_mode: str = env_setting("MODELSERVE_PICKER_FAILURE_MODE", _failure_mode, default="FailClose")

    def __post_init__(self) -> None:
        if self.inference_pools and not self.picker_service:
            raise ConfigError("MODELSERVE_PICKER_SERVICE is required with MODELSERVE_INFERENCE_POOLS=true")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Build settings from `MODELSERVE_*` variables; raise ConfigError naming the bad one."""
        return read_env(cls, env)

    @property
    def sidecar_limits(self) -> dict[str, object]:
        """The sidecar settings of every pod's client limits, by their names there."""
        return {name: getattr(self, "sidecar_" + name) for name in sidecar.CLIENT_LIMITS}

    def engine_image(self, engine: str, pinned: str) -> str:
        """The image the operator runs `engine` with: its setting, else the pinned one."""
        return self.engine_images.get(engine, pinned)

    def with_images(self, sidecar: str, engine: str | None, engine_image: str | None) -> Settings:
        """These settings with the sidecar's image and one engine's image set (to render the images a
        ModelServer already runs); `engine` None: the sidecar's only."""
        images = {**self.engine_images, engine: engine_image} if engine and engine_image else self.engine_images
        return dataclasses.replace(self, sidecar_image=sidecar, engine_images=images)

    def with_node_cache(self, used: bool) -> Settings:
        """These settings with the node cache kept (`used`) or left out, to render what pods run."""
        return self if used else dataclasses.replace(self, node_cache_url="")
