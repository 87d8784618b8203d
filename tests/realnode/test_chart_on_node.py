"""The chart's operator as a real pod on the real node: its image from our Dockerfile, its
ServiceAccount, the API server through the `kubernetes` Service, and a ModelServer it serves, whose
pod fetches its model through the chart's node cache (the DaemonSet's agent on this node)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import Cluster
from tests.helpers.node_view import NodeView, cpu_server, install_chart


def test_chart_operator_runs_as_a_pod_and_serves_a_model(node_cluster: Cluster, tmp_path: Path) -> None:
    release, system, apps = "modelserve", f"ms-system-{uuid.uuid4().hex[:6]}", f"apps-{uuid.uuid4().hex[:6]}"
    node_cluster.create_namespace(apps)
    install_chart(node_cluster, release, system)
    try:
        pods = json.loads(node_cluster.kubectl("get", "pods", "-n", system, "-o", "json").stdout)["items"]
        by_component = {pod["metadata"]["labels"]["app.kubernetes.io/component"]: pod for pod in pods}
        assert sorted(by_component) == ["gateway", "nodecache", "operator"]
        assert all(pod["spec"]["nodeName"] == realnode.NODE_NAME for pod in pods)
        assert by_component["operator"]["spec"]["serviceAccountName"] == release
        assert by_component["gateway"]["spec"]["serviceAccountName"] == f"{release}-gateway"
        view = NodeView(node_cluster, apps, tmp_path / "no-host-operator.log")
        view.apply(cpu_server("from-chart", public=True))
        ready = view.wait_phase("from-chart", "Ready")
        # No operator runs outside the cluster in this module: the pod's operator did this.
        assert ready["status"]["readyReplicas"] == 1
        # The chart's agent answered the pod's fetch (no fallback to the hub, which the result would say).
        (pod,) = view.pods("from-chart")
        result = fetch_result(pod)
        assert result is not None and not result.node_cache and result.hub_bytes + result.node_bytes > 0, result
    finally:
        node_cluster.kubectl("delete", "namespace", apps, "--wait=false", check=False)
        node_cluster.kubectl("delete", "pods", "--all", "-n", apps, "--grace-period=1", "--wait=false", check=False)
        node_cluster.helm("uninstall", release, "--namespace", system, "--wait", "--timeout", "120s")
