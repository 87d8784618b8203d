"""Control-plane fixtures of the API, operator and packaging tests (registered for the whole suite by
tests/conftest.py): the CRD installed, the operator running as a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.testdata import CRD_PATH
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import tail
from tests.helpers.operator_cluster import RESYNC_SECONDS, OperatorView


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> None:
    # Forced: the chart tests may have installed the chart's copy of the same CRD first.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("modelservers.serving.modelserve.dev")


@pytest.fixture(scope="session")
def operator_process(
    cluster: Cluster, crd_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`modelserve-operator` against the test cluster, resyncing every 2 s; stopped at session end."""
    with running_operator(cluster.operator_env, tmp_path_factory.mktemp("operator"), RESYNC_SECONDS) as running:
        yield running


@pytest.fixture
def ops(cluster: Cluster, operator_process: tuple[subprocess.Popen, Path], namespace: str) -> OperatorView:
    """Helpers against a running operator, scoped to this test's namespace."""
    process, log = operator_process
    assert process.poll() is None, f"the operator has exited:\n{tail(log)}"
    return OperatorView(cluster, namespace, log)
