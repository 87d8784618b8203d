"""A replica spanning nodes where LeaderWorkerSet is not installed: the ModelServer says what to
install, and goes on once it is, without an operator restart. A control plane of its own, started
without LeaderWorkerSet (the shared one has it from the start)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.testdata import CRD_PATH, examples
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from tests.helpers.operator_cluster import RESYNC_SECONDS, OperatorView


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("no-lws"), cpu_nodes=0, real_node=False, lws=False) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        cluster.wait_established()
        yield cluster


LWS_START_SECONDS = 180


def test_without_leader_worker_set_the_model_says_what_to_install_then_runs_once_it_is(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = bare_cluster
    cluster.create_namespace("big")
    with running_operator(cluster.operator_env, tmp_path, RESYNC_SECONDS) as (process, log):
        ops = OperatorView(cluster, "big", log)
        ops.apply(examples()["lfm2-24b-a2b-16gpu"])
        name = "lfm2-24b-a2b-16gpu"
        degraded = ops.wait_reason(name, "Degraded", "True", "LeaderWorkerSetMissing")
        assert "install the LeaderWorkerSet release" in degraded["message"]
        assert "LeaderWorkerSetMissing" in ops.kubectl("get", "ms", name).stdout
        warnings = [e for e in ops.events(name) if (e["type"], e["reason"]) == ("Warning", "LeaderWorkerSetMissing")]
        assert warnings and "leaderworkerset.x-k8s.io/v1" in warnings[0]["message"]
        # Nothing was made in its place: no Deployment serving a model that needs two nodes.
        assert ops.get("deployment", name) is None and ops.get("service", name) is None

        cluster.start_lws()
        # LeaderWorkerSet's controller starts now and makes the group's worker pods through its own
        # StatefulSet: on two busy cores the worker came more than 60 s after the leader.
        ms = ops.wait_ready(name, timeout=LWS_START_SECONDS)
        assert ms["status"]["readyReplicas"] == 1 and ops.get("leaderworkerset", name)
        assert process.poll() is None
