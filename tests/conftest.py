"""Session-wide fixtures: one real control plane per test session."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from modelserve_sandbox.cluster import Cluster


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok (2 nodes x 8 GPUs, 1 CPU node).

    KWOK only: the tests of reconcile logic get pods that turn Ready at once. The tests that run
    pods for real have a cluster of their own with the real node (tests/realnode)."""
    workdir = tmp_path_factory.mktemp("cluster")
    with Cluster(workdir, real_node=False) as running:
        yield running
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if request.session.testsfailed:
        # Keep every process's log for the failing run; the data dir is of no use after it.
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
        if reporter:
            reporter.write_line(f"control plane logs kept in {workdir / 'logs'}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) for one test, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
