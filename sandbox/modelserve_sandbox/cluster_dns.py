"""Cluster DNS for the real node: CoreDNS (built from its Go module by hack/build-coredns.sh) as a
host process beside the control plane, behind the `kube-dns` Service at the cluster DNS address.

Its `kubernetes` plugin watches the sandbox's API server, so pods on `real-0` resolve Services
(`<svc>.<ns>.svc.cluster.local`, what `status.endpoint` advertises) and pod hostnames in headless
Services (LeaderWorkerSet's `LWS_LEADER_ADDRESS`), as in a user's cluster. It runs on the host,
not as a pod, like the LWS controller: the sandbox's own machinery starts before the node does and
never waits on an image. It listens on the bridge's address, on a port of its own (port 53 on the
host is not ours to take); kube-proxy takes the Service's port 53 there, through a selectorless
`kube-dns` Service and its EndpointSlice, as it would to CoreDNS pods.

Nothing outside the cluster domain is forwarded: the sandbox reaches nothing outside this machine,
so any other name gets a quick NXDOMAIN rather than a query to the host's resolvers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BINARY = "coredns"
VERSION = "1.15.0"  # hack/build-coredns.sh's pin
CLUSTER_DOMAIN = "cluster.local"
SERVICE_IP = "10.0.0.10"  # in the sandbox's Service range; `.10` as kubeadm chooses
SERVICE_NAME = "kube-dns"  # the name clusters give it: tools look it up in kube-system
NAMESPACE = "kube-system"
# Where reverse lookups of pod and Service addresses are answered (the sandbox's two ranges).
REVERSE_ZONES = ("in-addr.arpa", "ip6.arpa")


def corefile(kubeconfig: Path, host: str, port: int, ready_port: int) -> str:
    """Two server blocks on one port: the cluster's zones from the API server, everything else
    NXDOMAIN. `ready` answers 200 once the kubernetes plugin has synced its first lists."""
    zones = " ".join((CLUSTER_DOMAIN, *REVERSE_ZONES))
    listen = " ".join(f"{zone}:{port}" for zone in (CLUSTER_DOMAIN, *REVERSE_ZONES))
    return f"""{listen} {{
    bind {host}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {zones} {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
.:{port} {{
    bind {host}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def manifests(host: str, port: int) -> list[dict[str, Any]]:
    """The `kube-dns` Service at SERVICE_IP, with no selector, and the EndpointSlice naming the
    host process: what kube-proxy turns into the rules from pods to CoreDNS."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "clusterIP": SERVICE_IP,
            "ports": [{"name": name, "protocol": protocol, "port": 53, "targetPort": port} for name, protocol in ports],
        },
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE_NAME}-host",
            "namespace": NAMESPACE,
            "labels": {
                **labels,
                "kubernetes.io/service-name": SERVICE_NAME,
                "endpointslice.kubernetes.io/managed-by": "sandbox.modelserve.dev",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": name, "protocol": protocol, "port": port} for name, protocol in ports],
    }
    return [service, endpoints]
