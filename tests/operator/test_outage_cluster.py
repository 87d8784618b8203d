"""The operator through an API server outage: it keeps running and acts on what comes after."""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.testdata import CRD_PATH
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import tail, wait_until

OUTAGE_SECONDS = 30


def _model_server(name: str) -> str:
    spec = {"model": "LiquidAI/LFM2-350M", "auth": {"mode": "public"}}
    return json.dumps(
        {
            "apiVersion": "serving.modelserve.dev/v1alpha1",
            "kind": "ModelServer",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }
    )


def test_after_an_outage_a_new_modelserver_gets_its_deployment(tmp_path: Path) -> None:
    # A control plane of its own: the outage must not reach the other tests' cluster.
    with Cluster(tmp_path / "cluster", gpu_nodes=1, cpu_nodes=0, real_node=False) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        cluster.wait_established()

        def deployment(name: str) -> bool:
            return cluster.kubectl("get", "deployment", name, "--ignore-not-found", "-o", "name").stdout != ""

        with running_operator(cluster.operator_env, tmp_path / "operator") as (operator, log):
            cluster.kubectl("apply", "-f", "-", input=_model_server("before"))
            wait_until(lambda: deployment("before"), 60, "the first Deployment")
            cluster.restart_apiserver(OUTAGE_SECONDS)
            back = time.monotonic()
            cluster.kubectl("apply", "-f", "-", input=_model_server("after"))
            wait_until(
                lambda: deployment("after"),
                60,
                "a Deployment after the outage",
                interval=0.1,
                on_timeout=lambda: "\n" + tail(log, 40),
            )
            assert operator.poll() is None, tail(log, 40)
            print(
                f"after a {OUTAGE_SECONDS} s outage: API server back -> new Deployment in "
                f"{time.monotonic() - back:.1f} s"
            )
