"""The operator's start-up wiring (handlers.start and stop, called as kopf calls them) against a
control plane of its own: every piece it wires is running and connected to the others, with the
settings the environment gave, and stops when kopf's cleanup runs.

Its own control plane: the operator runs in this process and must not meet the session's, which
reconciles every namespace."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kopf
import pytest
from kubernetes import client
from kubernetes.config import kube_config
from prometheus_client.parser import text_string_to_metric_families

from harness.testdata import CRD_PATH
from modelserve.contracts import gateway
from modelserve.contracts.env import settings_or_exit
from modelserve.contracts.names import Key
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.watch_cache import API_RETRY_BACKOFFS
from modelserve.operator import handlers
from modelserve.operator.main import operator_memo
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import free_ports, wait_until

NAMESPACE = "wired"
ELSEWHERE = "elsewhere"  # a namespace the operator is not given
WAIT_SECONDS = 60
SIDECAR_IMAGE = "registry.example/modelserve/sidecar:wired"
GATEWAY_URL = "http://gateway.wired.example:8080"
CLUSTER_DOMAIN = "wired.example"
LEASE = "modelserve-operator"
# Threads the operator's pieces run in, each stopped (and joined) by handlers.stop; the watches end
# on their own once their watch times out, so they are left out.
STOPPED_THREADS = ("modelserve-autoscaler", "modelserve-resync", "modelserve-lease", "reconcile-")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("start"), gpu_nodes=1, cpu_nodes=0, real_node=False, lws=False) as running:
        running.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        running.wait_established()
        running.create_namespace(NAMESPACE)
        running.create_namespace(ELSEWHERE)
        yield running


class _HeldGateway:
    """A gateway given by address (as `make dev`'s on the host) that holds requests for ModelServers."""

    def __init__(self, held: dict[Key, int]) -> None:
        body = json.dumps(gateway.held_to_json(held)).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path == gateway.HELD_ROUTE
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="held-gateway", daemon=True)

    def __enter__(self) -> _HeldGateway:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _model_server(name: str, namespace: str = NAMESPACE, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": "LiquidAI/LFM2-350M", "auth": {"mode": "public"}, **spec},
    }


def _gateway_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gateway-0", "namespace": NAMESPACE, "labels": {gateway.GATEWAY_LABEL: "wired"}},
        "spec": {"containers": [{"name": gateway.GATEWAY_CONTAINER, "image": "registry.example/gateway:wired"}]},
    }


def _get(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    result = cluster.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json", "--ignore-not-found")
    return json.loads(result.stdout) if result.stdout.strip() else {}


def _holder(cluster: Cluster) -> str | None:
    return (_get(cluster, "lease", LEASE).get("spec") or {}).get("holderIdentity")


def _started(before: set[threading.Thread], names: tuple[str, ...]) -> list[str]:
    """The threads named so that are running and were not before the operator started."""
    return sorted(
        t.name for t in threading.enumerate() if t not in before and t.is_alive() and t.name.startswith(names)
    )


def test_start_wires_every_piece_with_the_environments_settings_and_stop_ends_them(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's own credentials, as its process finds them; the client's default configuration,
    # which api_client() replaces, is put back after.
    monkeypatch.setenv("KUBECONFIG", str(cluster.operator_kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.operator_kubeconfig))
    monkeypatch.setattr(client.Configuration, "_default", client.Configuration._default)
    metrics_port = free_ports(1)[0]
    with _HeldGateway({(NAMESPACE, "sleepy"): 1}) as held:
        for variable, value in {
            "MODELSERVE_SIDECAR_IMAGE": SIDECAR_IMAGE,
            "MODELSERVE_GATEWAY_URL": GATEWAY_URL,
            "MODELSERVE_CLUSTER_DOMAIN": CLUSTER_DOMAIN,
            "MODELSERVE_RESYNC_SECONDS": "1",
            "MODELSERVE_METRICS_PORT": str(metrics_port),
            "MODELSERVE_GATEWAY_POD_NAMESPACE": NAMESPACE,
            "MODELSERVE_GATEWAY_ADDRESSES": held.address,
            "MODELSERVE_LEADER_ELECTION_LEASE": f"{NAMESPACE}/{LEASE}",
        }.items():
            monkeypatch.setenv(variable, value)
        # As `modelserve-operator` does: the settings from the environment, into kopf's memo.
        memo = operator_memo(settings_or_exit(Settings, "modelserve-operator"), (NAMESPACE,))
        kopf_settings = kopf.OperatorSettings()
        before = set(threading.enumerate())
        handlers.start(settings=kopf_settings, memo=memo)
        try:
            _check_running(cluster, memo, kopf_settings, before, metrics_port)
        finally:
            handlers.stop(memo=memo)
    # Every piece stopped: its threads ended (each stop joins them) and the Lease is free for a standby.
    assert _started(before, STOPPED_THREADS) == [], "still running after stop"
    assert _holder(cluster) is None


def _check_running(
    cluster: Cluster,
    memo: kopf.Memo,
    kopf_settings: kopf.OperatorSettings,
    before: set[threading.Thread],
    metrics_port: int,
) -> None:
    assert kopf_settings.posting.enabled is False  # the reconciler posts its own Events
    assert kopf_settings.networking.error_backoffs == API_RETRY_BACKOFFS
    assert memo.started.wait(WAIT_SECONDS), "the operator never started: caches unlisted or no Lease"

    # Leading on the Lease the environment named, renewed by a running keeper.
    assert memo.elector is not None and _holder(cluster) == memo.elector.identity
    running = ("modelserve-autoscaler", "modelserve-lease", "modelserve-resync")
    assert _started(before, running) == list(running)
    assert len(_started(before, ("reconcile-",))) == handlers.WORKERS
    assert memo.resync.interval == 1.0

    # A ModelServer created now: the watch cache sees it, the queue hands it to the reconciler,
    # which applies its children and writes a status with the environment's settings. One created
    # before it in another namespace is not seen: one watch of every namespace would have brought it first.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_model_server("m", ELSEWHERE)))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_model_server("m")))
    wait_until(lambda: memo.caches.modelservers.get(NAMESPACE, "m") is not None, WAIT_SECONDS, "the watch cache")
    assert memo.caches.modelservers.get(ELSEWHERE, "m") is None
    wait_until(lambda: bool(_get(cluster, "modelserver", "m").get("status")), WAIT_SECONDS, "the status of m")
    status = _get(cluster, "modelserver", "m")["status"]
    assert status["gatewayEndpoint"] == GATEWAY_URL
    assert status["endpoint"] == f"http://m.{NAMESPACE}.svc.{CLUSTER_DOMAIN}/v1"
    wait_until(lambda: bool(_get(cluster, "deployment", "m")), WAIT_SECONDS, "the Deployment of m")
    images = [c["image"] for c in _get(cluster, "deployment", "m")["spec"]["template"]["spec"]["containers"]]
    assert SIDECAR_IMAGE in images

    # The gateway's pods are watched in the namespace the environment named.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_gateway_pod()))
    assert memo.gateways is not None
    wait_until(lambda: memo.gateways.get(NAMESPACE, "gateway-0") is not None, WAIT_SECONDS, "the gateway pod cache")

    # A ModelServer at zero wakes up: the autoscaler reads the requests the gateway given by
    # address holds for it, and the reconciler applies its decision.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_model_server("sleepy", replicas={"min": 0, "max": 1})))
    wait_until(
        lambda: (_get(cluster, "deployment", "sleepy").get("spec") or {}).get("replicas") == 1,
        WAIT_SECONDS,
        "the autoscaler to wake sleepy for the held request",
    )
    wait_until(
        lambda: (
            (_get(cluster, "modelserver", "sleepy").get("status") or {}).get("scaling", {}).get("reason") == "ScaleUp"
        ),
        WAIT_SECONDS,
        "status.scaling of sleepy",
    )

    # The operator's own metrics, on the port the environment named (served until the process ends,
    # in the operator as here: nothing stops prometheus_client's server).
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        exposition = answer.read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    assert ("modelserve_operator_work_queue_depth", ()) in samples
    assert samples[("modelserve_operator_demand_held", (("modelserver", "sleepy"), ("namespace", NAMESPACE)))] == 1
