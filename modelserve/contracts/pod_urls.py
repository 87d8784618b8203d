"""A pod's own address as its readers name it (the gateway's replicas, the operator's reads of each
sidecar and gateway): `https://IP:PORT` when the container serving it names its port TLS_PORT_NAME,
else `IP:PORT` (plain HTTP), and a route's URL there. Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A container's port is named so when it serves HTTPS (the sidecar with spec.tls, the gateway with the
# chart's gateway.tls): what its readers take the scheme from.
TLS_PORT_NAME = "https"


def serves_tls(pod: Mapping[str, Any], container_name: str) -> bool:
    """Whether the pod's `container_name` serves HTTPS: one of its ports is named TLS_PORT_NAME."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == container_name:
            return any(port.get("name") == TLS_PORT_NAME for port in container.get("ports") or [])
    return False


def pod_base(pod: Mapping[str, Any], container_name: str, port: int) -> str:
    """The pod's `container_name` at its address: `https://IP:PORT` when it serves HTTPS, else `IP:PORT`."""
    address = f"{pod['status']['podIP']}:{port}"
    return f"https://{address}" if serves_tls(pod, container_name) else address


def url_of(base: str, route: str) -> str:
    """`route` at `base` (pod_base's, or an address given as such) as a URL (pure)."""
    return f"{base}{route}" if base.startswith("https://") else f"http://{base}{route}"
