"""What the operator tells each serving pod about its keys (pure): the key Secret's version (so the
kubelet refreshes the mounted keys at once, api/manifests.KEYS_VERSION_ANNOTATION), and how many
replicas share a ModelServer's key limits: its ready serving pods, written into each live serving
pod's annotation (api/manifests.REPLICAS_ANNOTATION). The
kubelet mirrors the annotation into the sidecar's downward API file, and each sidecar enforces 1/N of
every key's limit (sidecar/replica_share.py), so a limit holds for the ModelServer, not per replica."""

from __future__ import annotations

from typing import Any

from modelserve.api.manifests import REPLICAS_ANNOTATION
from modelserve.kube.pods import pod_ready

from .status import serving_pods


def sharing_replicas(pods: list[dict[str, Any]]) -> int:
    """The ready serving pods (a LeaderWorkerSet's leaders), at least 1: a replica that is starting
    alone will serve alone."""
    return max(1, sum(1 for pod in serving_pods(pods) if pod_ready(pod)))


def pods_to_tell(pods: list[dict[str, Any]], value: str, annotation: str = REPLICAS_ANNOTATION) -> list[str]:
    """The live serving pods whose `annotation` does not say `value` yet."""
    return [
        pod["metadata"]["name"]
        for pod in serving_pods(pods)
        if not pod["metadata"].get("deletionTimestamp")
        and (pod["metadata"].get("annotations") or {}).get(annotation) != value
    ]
