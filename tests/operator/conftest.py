"""Control-plane fixtures for the operator: the CRD installed, the operator running as a subprocess."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_cluster import RESYNC_SECONDS, OperatorView
from operator_testdata import CRD_PATH

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> None:
    # Forced: the chart tests may have installed the chart's copy of the same CRD first.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.kubectl("wait", "--for=condition=Established", "crd/modelservers.serving.modelserve.dev", "--timeout=60s")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def operator_process(
    cluster: Cluster, crd_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`modelserve-operator` against the test cluster, resyncing every 2 s; stopped at session end."""
    log_dir = tmp_path_factory.mktemp("operator")
    liveness = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
    env = {**cluster.env, "MODELSERVE_RESYNC_SECONDS": str(RESYNC_SECONDS)}
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
        yield process, log
    finally:
        stop_process(process, grace_seconds=20)


@pytest.fixture
def ops(cluster: Cluster, operator_process: tuple[subprocess.Popen, Path], namespace: str) -> OperatorView:
    """Helpers against a running operator, scoped to this test's namespace."""
    process, log = operator_process
    assert process.poll() is None, f"the operator has exited:\n{tail(log)}"
    return OperatorView(cluster, namespace, log)
