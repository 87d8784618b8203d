"""The LeaderWorkerSet controller (kubernetes-sigs/lws, built from its Go module by
hack/build-lws.sh) as a host process beside the control plane, with its webhooks working.

LeaderWorkerSet injects each group's variables (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE,
LWS_WORKER_INDEX) from a pod mutating webhook, so the controller is of no use without its
webhooks. In a cluster they are reached through a Service; here the API server runs on the host
and reaches the controller's webhook server on loopback: the webhook configurations name
`https://127.0.0.1:<port>/<path>` with the sandbox CA as caBundle, and the controller serves a
certificate from that CA (its own certificate management, which writes a Secret and patches
configurations made for a Service, is off).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

BINARY = "lws-manager"
VERSION = "0.9.0"  # hack/build-lws.sh's pin
CONFIG_API_VERSION = "config.lws.x-k8s.io/v1alpha1"
# The webhooks of lws v0.9.0 (config/webhook/manifests.yaml): path, resource group, resource, operations.
MUTATING = (
    (
        "mleaderworkerset.kb.io",
        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        ("CREATE", "UPDATE"),
    ),
    ("mpod.kb.io", "/mutate--v1-pod", "", "pods", ("CREATE",)),
)
VALIDATING = (
    (
        "vleaderworkerset.kb.io",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        ("CREATE", "UPDATE"),
    ),
    ("vpod.kb.io", "/validate--v1-pod", "", "pods", ("CREATE", "UPDATE")),
    (
        "vdisaggregatedset.kb.io",
        "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset",
        "disaggregatedset.x-k8s.io",
        "disaggregatedsets",
        ("CREATE", "UPDATE"),
    ),
)
# Only pods of a LeaderWorkerSet go through its pod webhooks (the controller ignores the others
# anyway): no other pod of the sandbox waits on, or fails with, this process.
LWS_POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
CONFIGURATION_NAME = "modelserve-sandbox-lws"


def crd_dir(cache: Path) -> Path:
    """The CRDs hack/build-lws.sh copied from the same module version it built."""
    return cache / "lws-crd"


def config(webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int) -> dict[str, Any]:
    """The controller's configuration file: everything on loopback, no leader election (one
    replica), no certificate management of its own."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
    }


def _webhook(
    name: str, path: str, group: str, resource: str, operations: tuple[str, ...], port: int, ca_bundle: str
) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": list(operations), "resources": [resource]}
        ],
    }
    if resource == "pods":
        webhook["objectSelector"] = LWS_POD_SELECTOR
    return webhook


def webhook_configurations(port: int, ca_cert: Path) -> list[dict[str, Any]]:
    """The mutating and validating webhook configurations pointing the API server at the
    controller's webhook server on 127.0.0.1:`port`."""
    ca_bundle = base64.b64encode(ca_cert.read_bytes()).decode()
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": CONFIGURATION_NAME},
            "webhooks": [_webhook(*hook, port=port, ca_bundle=ca_bundle) for hook in hooks],
        }
        for kind, hooks in (("MutatingWebhookConfiguration", MUTATING), ("ValidatingWebhookConfiguration", VALIDATING))
    ]


def probe(namespace: str) -> dict[str, Any]:
    """A LeaderWorkerSet to create with a server-side dry run: once the mutating webhook answers,
    it comes back with the defaults only the webhook sets (networkConfig.subdomainPolicy)."""
    container = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "webhook-probe", "namespace": namespace},
        "spec": {
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [container]}}},
        },
    }
