"""An idle operator is quiet: once everything matches, its only requests to the API server are the
watches, resync rounds included (read from the API server's audit log of the operator's user).
And what it no longer polls for, the watches bring at once: with no resync at all, a deleted
child or key Secret comes back."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.testdata import CRD_PATH
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import tail, wait_until

RESYNC_SECONDS = 2
NEVER_SECONDS = 24 * 3600  # a resync period no test outlives
IDLE_SECONDS = 15  # seven resync rounds
MODEL_SERVERS = 6
SELECTOR = "serving.modelserve.dev/modelserver"


def _model_server(index: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": "LiquidAI/LFM2-350M"}  # private: a generated key Secret each
    if index == 0:
        spec["cache"] = {"size": "1Gi"}  # and a claim (never bound here: no provisioner; its pod waits)
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": f"idle-{index}", "namespace": "default"},
        "spec": spec,
    }


def _requests_since(cluster: Cluster, since: datetime) -> list[dict[str, Any]]:
    return [
        event
        for event in cluster.operator_requests()
        if datetime.fromisoformat(event["stageTimestamp"]) > since and event["verb"] != "watch"
    ]


def _described(events: list[dict[str, Any]]) -> list[str]:
    return [f"{event['verb']} {event['requestURI']} ({event['userAgent']})" for event in events]


def test_an_idle_operator_only_watches(tmp_path: Path) -> None:
    # A control plane of its own: no other test's objects change while this one listens.
    with Cluster(tmp_path / "cluster", gpu_nodes=1, cpu_nodes=0, real_node=False) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        cluster.wait_established()
        with running_operator(cluster.operator_env, tmp_path / "operator", RESYNC_SECONDS) as (operator, log):
            items = [_model_server(index) for index in range(MODEL_SERVERS)]
            cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
            served = [f"modelserver/idle-{index}" for index in range(1, MODEL_SERVERS)]
            cluster.kubectl("wait", "--for=condition=Ready", *served, "--timeout=120s")
            cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Pending", "pod", "-l", f"{SELECTOR}=idle-0")
            assert any(e["verb"] == "watch" for e in cluster.operator_requests()), "the audit log saw no watch"
            time.sleep(2 * RESYNC_SECONDS)  # the last status writes and their echoes

            idle_from = datetime.now(UTC)
            time.sleep(IDLE_SECONDS)
            idle = _requests_since(cluster, idle_from)
            assert not idle, f"requests while idle: {_described(idle)}\n{tail(log, 20)}"

            # The same audit log does see the operator act: a deleted Deployment comes back.
            changed_from = datetime.now(UTC)
            cluster.kubectl("delete", "deployment", "idle-1")
            wait_until(lambda: _exists(cluster, "deployment", "idle-1"), 30, "the Deployment to come back")
            acted = _described(_requests_since(cluster, changed_from))
            assert any(line.startswith("patch /apis/apps/v1/namespaces/default/deployments/idle-1") for line in acted)
            assert operator.poll() is None, tail(log, 40)

        with running_operator(cluster.operator_env, tmp_path / "operator-2", NEVER_SECONDS) as (operator, log):
            time.sleep(2)  # its first lists
            key = _secret_data(cluster, "idle-2-api-keys")
            cluster.kubectl("delete", "secret", "idle-2-api-keys")
            cluster.kubectl("delete", "service", "idle-3")
            wait_until(
                lambda: _secret_data(cluster, "idle-2-api-keys") not in ("", key),
                30,
                "a new key Secret, with no resync to find it",
                on_timeout=lambda: "\n" + tail(log, 20),
            )
            wait_until(lambda: _exists(cluster, "service", "idle-3"), 30, "the Service back, with no resync")
            assert operator.poll() is None, tail(log, 40)


def _secret_data(cluster: Cluster, name: str) -> str:
    found = cluster.kubectl("get", "secret", name, "--ignore-not-found", "-o", "jsonpath={.data.api-key}")
    return found.stdout


def _exists(cluster: Cluster, kind: str, name: str) -> bool:
    return bool(cluster.kubectl("get", kind, name, "--ignore-not-found", "-o", "name").stdout)
