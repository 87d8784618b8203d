"""Session-wide fixtures (one real control plane per test session) and the markers, set here once.

Markers come from what a test needs, never by hand: `cluster` for the control plane (a fixture that
starts one, a test under tests/cluster or tests/realnode, or a module named *_cluster.py, which starts
its own), `engine` for a real engine process (the llama-server or model fixtures) or the real node,
`realnode` for the real node (tests/realnode, and `make dev`'s own test, which starts the sandbox
with its node), `install` for a fresh virtualenv built as the image's build stage builds it (pip and
a wheel: half a minute). `pytest -m "not cluster and not engine and not install"` is the fast unit
subset (`make test-fast`).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.llama_server import llama_server_binary

# Fixtures several test directories use (the layers' tests and the programs' share them).
pytest_plugins = ("tests.helpers.sidecar_fixtures", "tests.helpers.operator_fixtures")

TESTS = Path(__file__).parent
CLUSTER_FIXTURES = frozenset({"cluster", "node_cluster"})
ENGINE_FIXTURES = frozenset({"engine", "gguf_model", "llama_server", "node_cluster"})
# A fresh virtualenv built by the Dockerfile's own RUN lines (pip installs the wheel and its deps).
INSTALL_FIXTURES = frozenset({"image_venv"})
CLUSTER_DIRECTORIES = frozenset({"cluster", "realnode"})
# Whole directories, or single modules, whose tests run pods on the real node.
REAL_NODE_PATHS = (Path("realnode"), Path("cluster/test_sandbox_command.py"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        path = Path(item.path).relative_to(TESTS)
        realnode = any(path.is_relative_to(where) for where in REAL_NODE_PATHS)
        if used & CLUSTER_FIXTURES or path.parts[0] in CLUSTER_DIRECTORIES or path.stem.endswith("_cluster"):
            item.add_marker(pytest.mark.cluster)
        if used & ENGINE_FIXTURES or realnode:
            item.add_marker(pytest.mark.engine)
        if realnode:
            item.add_marker(pytest.mark.realnode)
        if used & INSTALL_FIXTURES:
            item.add_marker(pytest.mark.install)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The llama-server binary hack/setup.sh builds: a missing one fails the test, never skips it."""
    return llama_server_binary()


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
