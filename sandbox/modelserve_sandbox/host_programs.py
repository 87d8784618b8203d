"""The programs `make dev` runs on the host beside a sandbox cluster: the gateway and the operator,
wired together as the sandbox uses them (the tests start them through here too)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .cluster import Cluster
from .processes import free_ports, start_process, stop_process


@dataclass(frozen=True)
class HostPrograms:
    gateway: subprocess.Popen
    operator: subprocess.Popen
    gateway_address: str  # host:port

    @property
    def gateway_url(self) -> str:
        """The gateway's OpenAI base URL."""
        return f"http://{self.gateway_address}/v1"


def _script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@contextmanager
def host_programs(cluster: Cluster, operator_env: Mapping[str, str] | None = None) -> Iterator[HostPrograms]:
    """The gateway on the host, which reaches the real node's pods over its bridge, and the operator,
    which reads the requests that gateway holds from its address (a pod gateway, the chart's, is
    found by label instead). `operator_env`: more of the operator's settings. Both stop after."""
    (gateway_port,) = free_ports(1)
    address = f"127.0.0.1:{gateway_port}"
    gateway = start_process(
        "modelserve-gateway",
        [_script("modelserve-gateway")],
        cluster.log_dir,
        env={
            **cluster.env,
            "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(gateway_port),
        },
    )
    try:
        operator = start_process(
            "modelserve-operator",
            [_script("modelserve-operator")],
            cluster.log_dir,
            env={
                **cluster.operator_env,
                "MODELSERVE_GATEWAY_URL": f"http://{address}/v1",
                "MODELSERVE_GATEWAY_ADDRESSES": address,
                **(operator_env or {}),
            },
        )
        try:
            yield HostPrograms(gateway, operator, address)
        finally:
            stop_process(operator)
    finally:
        stop_process(gateway)
