"""A cluster of its own with the real node: containerd, runc, kubelet and kube-proxy run the pods.

The fixture needs the real node and fails saying why the host cannot run it; these tests are
never skipped. The operator runs as a host process per module (the chart test runs its own,
as a pod), pointed at the sandbox's model hub like `make dev`'s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_view import NodeView

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def node_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("node-cluster")
    with Cluster(workdir, gpu_nodes=1, real_node=True) as running:
        running.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        running.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield running
    if request.session.testsfailed:
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
        print(f"\nreal-node cluster logs kept in {workdir / 'logs'}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def host_operator(node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`modelserve-operator` as a host process against the real-node cluster; yields its log."""
    log_dir = tmp_path_factory.mktemp("node-operator")
    liveness = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
    env = {**node_cluster.env, "MODELSERVE_RESYNC_SECONDS": "5"}
    argv = [str(Path(sys.executable).with_name("modelserve-operator")), "--liveness", liveness]
    process = start_process("modelserve-operator", argv, log_dir, env=env)
    log = log_dir / "modelserve-operator.log"
    try:
        wait_until(
            lambda: process.poll() is not None or _healthy(liveness),
            60,
            "the operator's liveness endpoint",
            on_timeout=lambda: "\n" + tail(log),
        )
        assert process.poll() is None, f"the operator exited with {process.returncode}:\n{tail(log)}"
        yield log
    finally:
        stop_process(process, grace_seconds=20)


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


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
