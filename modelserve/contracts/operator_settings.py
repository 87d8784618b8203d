"""Operator settings, read once from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from modelserve_sidecar.contract import package_version

FIELD_MANAGER = "modelserve-operator"
ENGINE_IMAGE_PREFIX = "MODELSERVE_ENGINE_IMAGE_"


# How the operator's own requests show in the API server's audit log.
USER_AGENT = f"{FIELD_MANAGER}/{package_version()}"


@dataclass(frozen=True)
class Settings:
    """What the operator needs besides the ModelServer itself; every value has an env var."""

    sidecar_image: str  # MODELSERVE_SIDECAR_IMAGE
    drain_seconds: int = 60  # MODELSERVE_DRAIN_SECONDS: sidecar drain deadline; the engine outlives it
    startup_seconds: int = 3600  # MODELSERVE_STARTUP_SECONDS: cold start budget (image pull + download + load)
    resync_seconds: float = 60.0  # MODELSERVE_RESYNC_SECONDS: level-based resync of every ModelServer
    cluster_domain: str = "cluster.local"  # MODELSERVE_CLUSTER_DOMAIN: for status.endpoint
    # MODELSERVE_HUB_ENDPOINT: a Hugging Face Hub mirror every engine downloads from (air-gapped
    # clusters, the sandbox); set as HF_ENDPOINT and llama.cpp's MODEL_ENDPOINT. Empty: the hub.
    hub_endpoint: str = ""
    # MODELSERVE_ENGINE_IMAGE_<ENGINE> (VLLM, SGLANG, LLAMACPP): a mirror or a newer tag for every
    # ModelServer of that engine; a ModelServer's own spec.image still wins.
    engine_images: Mapping[str, str] = field(default_factory=dict)
    metrics_port: int = 0  # MODELSERVE_METRICS_PORT: the operator's own /metrics; 0: not served
    # MODELSERVE_GATEWAY_URL: the gateway's base URL, written to every status.gatewayEndpoint.
    gateway_url: str = ""
    # MODELSERVE_GATEWAY_NAMESPACE: where the gateway's pods run; the autoscaler reads the requests
    # they hold for ModelServers at zero. Empty: no gateway.
    gateway_namespace: str = ""
    # MODELSERVE_GATEWAY_ADDRESSES: host:port of gateways that are not pods (the sandbox runs one on
    # the host), comma-separated; their held requests count as well.
    gateway_addresses: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        return cls(
            sidecar_image=env.get("MODELSERVE_SIDECAR_IMAGE", f"ghcr.io/modelserve/modelserve:{package_version()}"),
            drain_seconds=int(env.get("MODELSERVE_DRAIN_SECONDS", cls.drain_seconds)),
            startup_seconds=int(env.get("MODELSERVE_STARTUP_SECONDS", cls.startup_seconds)),
            resync_seconds=float(env.get("MODELSERVE_RESYNC_SECONDS", cls.resync_seconds)),
            cluster_domain=env.get("MODELSERVE_CLUSTER_DOMAIN", cls.cluster_domain),
            hub_endpoint=env.get("MODELSERVE_HUB_ENDPOINT", cls.hub_endpoint),
            metrics_port=int(env.get("MODELSERVE_METRICS_PORT", cls.metrics_port)),
            gateway_url=env.get("MODELSERVE_GATEWAY_URL", cls.gateway_url),
            gateway_namespace=env.get("MODELSERVE_GATEWAY_NAMESPACE", cls.gateway_namespace),
            gateway_addresses=tuple(
                a.strip() for a in env.get("MODELSERVE_GATEWAY_ADDRESSES", "").split(",") if a.strip()
            ),
            engine_images={
                key.removeprefix(ENGINE_IMAGE_PREFIX).lower(): value
                for key, value in env.items()
                if key.startswith(ENGINE_IMAGE_PREFIX) and value
            },
        )

    def engine_image(self, engine: str, pinned: str) -> str:
        return self.engine_images.get(engine, pinned)
