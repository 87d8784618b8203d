"""A cluster of its own with the real node: containerd, runc, kubelet and kube-proxy run the pods.

The fixture needs the real node and fails saying why the host cannot run it; these tests are
never skipped. The operator runs as a host process per module (the chart test runs its own,
as a pod), pointed at the sandbox's model hub like `make dev`'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.host_programs import HostPrograms, host_programs
from modelserve_sandbox.hoststate import IPTABLES, iptables_additions, iptables_save, read_sysctls
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import free_ports, start_process, stop_process, wait_until
from tests.helpers.node_view import NodeView

REPO = Path(__file__).resolve().parents[2]


def host_snapshot(workdir: Path) -> dict[str, Any]:
    """What the real node may change on the host and must put back when it stops."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    processes = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(workdir).encode() in (proc / "cmdline").read_bytes():
                processes.append(proc.name)
    return {
        "sysctls": read_sysctls(),
        "iptables rules": {command: iptables_save(command) or "" for command in IPTABLES},
        "network links": sorted(os.listdir("/sys/class/net")),
        "network namespaces": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
        "mounts": sorted(mounts),
        "processes under the sandbox": processes,
    }


def _host_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    rules = "iptables rules"
    changes = [
        f"{what}: {before[what]} -> {after[what]}" for what in before if what != rules and before[what] != after[what]
    ]
    for command, saved in before[rules].items():
        now = after[rules][command]
        changes += [f"{command}: added {diff}" for diff in iptables_additions(saved, now)]
        changes += [f"{command}: removed {diff}" for diff in iptables_additions(now, saved)]
    return changes


@pytest.fixture(scope="session")
def node_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("node-cluster")
    before = host_snapshot(workdir)
    with Cluster(workdir, gpu_nodes=1, real_node=True) as running:
        running.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        running.wait_established()
        yield running
    # Stopping the node puts the host back as it was: the check runs on the real stop path.
    changes = _host_changes(before, host_snapshot(workdir))
    assert not changes, "the real node left the host changed:\n" + "\n".join(changes)
    if request.session.testsfailed:
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
        print(f"\nreal-node cluster logs kept in {workdir / 'logs'}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def operator_metrics_port() -> int:
    """Where the host operator serves its own /metrics."""
    return free_ports(1)[0]


@pytest.fixture(scope="module")
def host_operator(
    node_cluster: Cluster, operator_metrics_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """`modelserve-operator` as a host process against the real-node cluster; yields its log."""
    env = {**node_cluster.operator_env, "MODELSERVE_METRICS_PORT": str(operator_metrics_port)}
    with running_operator(env, tmp_path_factory.mktemp("node-operator"), resync_seconds=5) as (_, log):
        yield log


@pytest.fixture
def node(node_cluster: Cluster, host_operator: Path) -> Iterator[NodeView]:
    """A fresh namespace on the real-node cluster, with the operator running; deleted after."""
    name = f"n-{uuid.uuid4().hex[:8]}"
    node_cluster.create_namespace(name)
    yield NodeView(node_cluster, name, host_operator)
    # Pods go at once: the next test's pods need the node's two CPUs.
    node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    node_cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=false", check=False)


@pytest.fixture
def port_forward(node_cluster: Cluster) -> Iterator:
    """`kubectl port-forward` as a user runs it; returns the local base URL."""
    started: list[subprocess.Popen] = []

    def forward(namespace: str, target: str, remote_port: int) -> str:
        (port,) = free_ports(1)
        process = subprocess.Popen(
            [str(node_cluster.bin_dir / "kubectl"), "port-forward", "-n", namespace, target, f"{port}:{remote_port}"],
            env=node_cluster.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(process)
        line = process.stdout.readline() if process.stdout else ""
        assert "Forwarding from" in line, f"kubectl port-forward said: {line}"
        return f"http://127.0.0.1:{port}"

    yield forward
    for process in started:
        stop_process(process)


@pytest.fixture(scope="module")
def host_gateway(node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`modelserve-gateway` on the host as `make dev` runs it; yields its base URL."""
    (port,) = free_ports(1)
    logs = tmp_path_factory.mktemp("host-gateway")
    process = start_process(
        "modelserve-gateway",
        [str(Path(sys.executable).with_name("modelserve-gateway"))],
        logs,
        env={
            **node_cluster.env,
            "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
        },
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"), 60, "the host gateway")
        yield base
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def sandbox(node_cluster: Cluster) -> Iterator[HostPrograms]:
    """The gateway and the operator on the host, wired as `make dev` runs them (host_programs)."""
    with host_programs(node_cluster) as programs:
        yield programs


@pytest.fixture
def view(node_cluster: Cluster, sandbox: HostPrograms) -> Iterator[NodeView]:
    """A fresh namespace beside `sandbox`'s operator and gateway; deleted after."""
    name = f"dev-{uuid.uuid4().hex[:8]}"
    node_cluster.create_namespace(name)
    yield NodeView(node_cluster, name, node_cluster.log_dir / "modelserve-operator.log")
    node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    node_cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=false", check=False)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False
