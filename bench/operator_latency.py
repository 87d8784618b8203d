"""Operator latency in the sandbox: `kubectl apply` of a ModelServer -> Deployment created -> Ready.

Starts its own control plane (KWOK GPU nodes) and operator, applies N ModelServers one after the
other and reports the median, min and max of:
  - apply -> Deployment created (the operator's reaction),
  - apply -> ModelServer Ready (operator + scheduler + KWOK + status write),
and, as the baseline from the same run, `kubectl apply` of the very Deployment the operator makes
-> all its replicas ready (what the control plane alone takes). Usage:

    .venv/bin/python -m bench.operator_latency [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelserve.api.manifests import deployment
from modelserve.api.spec import ModelServer
from modelserve.contracts.names import API_VERSION, KIND
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.apply import Kube
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import start_process, stop_process, wait_until

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
POLL_SECONDS = 0.02
TIMEOUT_SECONDS = 60


def model_server(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"model": "LiquidAI/LFM2-350M", "maxModelLen": 2048},
    }


def first_time(condition: Callable[[], bool], started: float) -> float:
    """Seconds from `started` until `condition` first holds (polled every 20 ms)."""
    wait_until(condition, TIMEOUT_SECONDS, "the measured condition", interval=POLL_SECONDS)
    return time.monotonic() - started


def ready(kube: Kube, name: str) -> bool:
    status = (kube.get(API_VERSION, KIND, NAMESPACE, name) or {}).get("status", {})
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def deployment_ready(kube: Kube, name: str) -> bool:
    found = kube.get("apps/v1", "Deployment", NAMESPACE, name) or {}
    wanted = found.get("spec", {}).get("replicas")
    return wanted is not None and found.get("status", {}).get("readyReplicas") == wanted


def measure_operator(cluster: Cluster, kube: Kube, name: str) -> tuple[float, float]:
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(model_server(name)))
    created = first_time(lambda: kube.get("apps/v1", "Deployment", NAMESPACE, name) is not None, started)
    return created, first_time(lambda: ready(kube, name), started)


def measure_baseline(cluster: Cluster, kube: Kube, name: str) -> float:
    manifest = model_server(name)
    manifest["metadata"]["uid"] = "none"
    plain = deployment(ModelServer.from_manifest(manifest), Settings.from_env())
    del plain["metadata"]["ownerReferences"]
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(plain))
    return first_time(lambda: deployment_ready(kube, name), started)


def summary(label: str, values: list[float]) -> str:
    return (
        f"{label:<46} median {statistics.median(values) * 1000:7.0f} ms   "
        f"min {min(values) * 1000:6.0f}   max {max(values) * 1000:6.0f}   (n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-latency-") as tmp, Cluster(Path(tmp), real_node=False) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "modelserver.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        kube = Kube(cluster.api_client())
        argv = [str(Path(sys.executable).with_name("modelserve-operator"))]
        operator = start_process("modelserve-operator", argv, cluster.log_dir, env=cluster.env)
        try:
            # One unmeasured run: the operator's watches are up once it has reconciled something.
            measure_operator(cluster, kube, "warm-up")
            created, readied, baseline = [], [], []
            for run in range(args.runs):
                to_deployment, to_ready = measure_operator(cluster, kube, f"bench-{run}")
                created.append(to_deployment)
                readied.append(to_ready)
                baseline.append(measure_baseline(cluster, kube, f"baseline-{run}"))
                cluster.kubectl("delete", "ms", f"bench-{run}", "--wait=false")
                cluster.kubectl("delete", "deployment", f"baseline-{run}", "--wait=false")
        finally:
            stop_process(operator)
        print(summary("kubectl apply ModelServer -> Deployment", created))
        print(summary("kubectl apply ModelServer -> Ready", readied))
        print(summary("baseline: kubectl apply Deployment -> ready", baseline))
        overhead = statistics.median(readied) - statistics.median(baseline)
        print(f"operator overhead on time to ready (median): {overhead * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
