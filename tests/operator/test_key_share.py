"""How many replicas share a ModelServer's key limits, and which pods are told (operator/key_share.py)."""

from __future__ import annotations

from typing import Any

from modelserve.api.manifests import REPLICAS_ANNOTATION
from modelserve.operator.key_share import pods_to_tell, sharing_replicas


def pod(
    name: str, ready: bool, told: str | None = None, deleting: bool = False, worker: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "annotations": {REPLICAS_ANNOTATION: told} if told else {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    if worker:
        metadata["labels"] = {"leaderworkerset.sigs.k8s.io/worker-index": "1"}
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": metadata, "status": status}


def test_the_ready_serving_pods_share_the_limits() -> None:
    pods = [pod("a", True), pod("b", True), pod("c", False), pod("d", True, deleting=True), pod("w", True, worker=True)]
    assert sharing_replicas(pods) == 2  # not the starting one, the going one, nor a group's worker


def test_a_lone_starting_replica_counts_as_one() -> None:
    assert sharing_replicas([]) == 1 and sharing_replicas([pod("a", False)]) == 1


def test_only_live_serving_pods_not_yet_told_are_patched() -> None:
    pods = [pod("a", True, "2"), pod("b", False, "1"), pod("c", True), pod("d", True, deleting=True)]
    assert pods_to_tell(pods, "2") == ["b", "c"]


def test_the_key_secrets_version_is_told_as_its_own_annotation() -> None:
    from modelserve.api.manifests import KEYS_VERSION_ANNOTATION

    told = pod("a", True)
    told["metadata"]["annotations"][KEYS_VERSION_ANNOTATION] = "41"
    assert pods_to_tell([told, pod("b", True)], "41", KEYS_VERSION_ANNOTATION) == ["b"]
    assert pods_to_tell([told], "42", KEYS_VERSION_ANNOTATION) == ["a"]
