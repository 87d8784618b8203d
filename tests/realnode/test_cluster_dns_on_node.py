"""Cluster DNS on the real node, as a user's cluster has it: CoreDNS (the sandbox's, built from its
Go module) behind `kube-dns`, the kubelet's `--cluster-dns`. A pod resolves Services by name, and a
LeaderWorkerSet's worker resolves its leader's hostname (`LWS_LEADER_ADDRESS`, a pod of the group's
headless Service) to the leader pod's address; names outside the cluster get NXDOMAIN at once. And a
vLLM group's worker, started before its leader's Ray head answers, waits for it with the script the
operator generates and joins it, with no restart of the group."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from modelserve import __version__
from modelserve.engines.ray_group import WORKER_SCRIPT
from modelserve_sandbox import cluster_dns
from modelserve_sandbox.cluster import API_SERVICE_IP, Cluster
from modelserve_sandbox.processes import wait_until
from tests.helpers.node_view import remove_namespace

IMAGE = f"ghcr.io/modelserve/modelserve:{__version__}"
# Runs in each pod of the group: the leader's name from LeaderWorkerSet's webhook, resolved within
# a bound (the record appears once the leader has an address), then a Service and an outside name.
RESOLVE = """
import json, os, socket, time
def lookup(name):
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})
    except socket.gaierror as error:
        return error.errno
leader = os.environ["LWS_LEADER_ADDRESS"]
deadline = time.monotonic() + 120
while not isinstance(found := lookup(leader), list) and time.monotonic() < deadline:
    time.sleep(1)
print(json.dumps({"leader_address": leader, "leader": found, "dns_service": lookup("kube-dns.kube-system"),
    "api_service": lookup("kubernetes.default.svc.cluster.local"), "outside": lookup("example.com"),
    "resolv_conf": open("/etc/resolv.conf").read()}), flush=True)
time.sleep(600)
"""


def group(name: str) -> dict:
    container = {"name": "main", "image": IMAGE, "command": ["python", "-c", RESOLVE]}
    template = {"spec": {"containers": [container], "terminationGracePeriodSeconds": 1}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 2, "leaderTemplate": template, "workerTemplate": template},
        },
    }


@pytest.fixture
def namespace(node_cluster: Cluster) -> Iterator[str]:
    name = f"dns-{uuid.uuid4().hex[:8]}"
    node_cluster.create_namespace(name)
    yield name
    remove_namespace(node_cluster, name, f"namespace {name}'s pods gone")


def test_a_group_worker_resolves_its_leader_and_services_by_name(node_cluster: Cluster, namespace: str) -> None:
    node_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(group("resolve")))

    def said(pod: str) -> dict | None:
        log = node_cluster.kubectl("logs", pod, "-n", namespace, check=False).stdout
        return next((json.loads(line) for line in log.splitlines() if line.startswith("{")), None)

    wait_until(lambda: said("resolve-0-1") is not None, 180, "the worker's lookups")
    worker = said("resolve-0-1")
    assert worker is not None
    leader = json.loads(node_cluster.kubectl("get", "pod", "resolve-0", "-n", namespace, "-o", "json").stdout)
    assert worker["leader_address"] == f"resolve-0.resolve.{namespace}"
    assert worker["leader"] == [leader["status"]["podIP"]], worker
    assert worker["dns_service"] == [cluster_dns.SERVICE_IP], worker
    assert worker["api_service"] == [API_SERVICE_IP], worker
    assert worker["outside"] == -2, worker  # EAI_NONAME: NXDOMAIN, nothing asked outside the machine
    assert f"nameserver {cluster_dns.SERVICE_IP}" in worker["resolv_conf"]
    assert f"search {namespace}.svc.{cluster_dns.CLUSTER_DOMAIN}" in worker["resolv_conf"]


# The leader: its "Ray head" (a listener on Ray's port) answers only once the test says so, after the
# worker was seen waiting for it, as a head does once its image is pulled (bounded: 5 minutes).
OPEN_HEAD = "/tmp/open-head"
LATE_HEAD = f"""
import os, socket, time
deadline = time.monotonic() + 300
while not os.path.exists("{OPEN_HEAD}") and time.monotonic() < deadline:
    time.sleep(0.2)
server = socket.create_server(("", 6379))
print("head up", flush=True)
while True:
    server.accept()[0].close()
"""
# In place of `ray` in the worker's image (ours has none): what `ray start` was asked, then stay up.
RAY_SHIM = "printf '#!/bin/sh\\necho \"ray $*\"\\nexec sleep 600\\n' > /shim/ray && chmod +x /shim/ray"


def late_head_group(name: str) -> dict:
    shim = {"name": "shim", "mountPath": "/shim"}
    leader = {"name": "main", "image": IMAGE, "command": ["python", "-c", LATE_HEAD]}
    worker = {
        "name": "main",
        "image": IMAGE,
        "command": ["/bin/sh", "-c", WORKER_SCRIPT, "vllm-worker"],  # as the operator generates it
        "env": [{"name": "PATH", "value": "/shim:/usr/local/bin:/usr/bin:/bin"}],
        "volumeMounts": [shim],
    }
    init = {"name": "ray-shim", "image": IMAGE, "command": ["/bin/sh", "-c", RAY_SHIM], "volumeMounts": [shim]}
    pod = {"terminationGracePeriodSeconds": 1, "volumes": [{"name": "shim", "emptyDir": {}}]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",  # what the operator sets
                "leaderTemplate": {"spec": {**pod, "containers": [leader]}},
                "workerTemplate": {"spec": {**pod, "initContainers": [init], "containers": [worker]}},
            },
        },
    }


def test_a_vllm_worker_started_before_its_head_waits_and_joins_without_a_group_restart(
    node_cluster: Cluster, namespace: str
) -> None:
    node_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(late_head_group("late")))

    def pod(name: str) -> dict:
        out = node_cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def log(name: str) -> str:
        return node_cluster.kubectl("logs", name, "-n", namespace, check=False).stdout

    # The container's log is both its streams: the wait's lines are on stderr.
    wait_until(lambda: "does not answer yet" in log("late-0-1"), 120, "the worker waiting for its head")
    worker_uid = pod("late-0-1")["metadata"]["uid"]
    wait_until(lambda: pod("late-0").get("status", {}).get("phase") == "Running", 120, "the leader running")
    node_cluster.kubectl("exec", "late-0", "-n", namespace, "--", "touch", OPEN_HEAD)
    wait_until(lambda: "ray start" in log("late-0-1"), 180, "the worker joining its head")
    assert "head up" in log("late-0")
    joined = next(line for line in log("late-0-1").splitlines() if line.startswith("ray start"))
    assert joined == f"ray start --address=late-0.late.{namespace}:6379 --block --disable-usage-stats"
    for name in ("late-0", "late-0-1"):
        statuses = pod(name)["status"]["containerStatuses"]
        assert [s["restartCount"] for s in statuses] == [0], statuses
    assert pod("late-0-1")["metadata"]["uid"] == worker_uid  # the group was never recreated
