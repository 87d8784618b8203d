"""The fake nodes KWOK manages: GPU nodes tainted as GPU clouds do, and plain CPU nodes.

Beside a real node every fake node carries KWOK's own taint too, so a pod that does not ask for
a fake node runs for real: a cpu ModelServer, the chart's operator, and a one-GPU vLLM pod (the
real node advertises two `nvidia.com/gpu`). A pod that wants a fake node tolerates
`kwok.x-k8s.io/node` and selects `type: kwok`; without a real node nothing is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FAKE_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


@dataclass(frozen=True)
class NodeShape:
    gpu_nodes: int = 2
    gpus_per_node: int = 8
    cpu_nodes: int = 1
    taint_fakes: bool = False  # True beside a real node
    pods_per_node: int = 110  # the kubelet's default; benchmarks with thousands of pods raise it


def _node(name: str, labels: dict[str, str], capacity: dict[str, str], taints: list[dict[str, str]]) -> dict:
    # Created with its status: a create keeps it, and the scheduler reads allocatable from it.
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": dict(KWOK_ANNOTATION),
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": {"taints": taints},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def node_manifests(shape: NodeShape) -> list[dict]:
    gpu = [
        _node(
            f"gpu-{i}",
            {"nvidia.com/gpu.present": "true"},
            {
                "cpu": "32",
                "memory": "256Gi",
                "pods": str(shape.pods_per_node),
                "nvidia.com/gpu": str(shape.gpus_per_node),
            },
            [dict(GPU_TAINT), dict(FAKE_TAINT)] if shape.taint_fakes else [dict(GPU_TAINT)],
        )
        for i in range(shape.gpu_nodes)
    ]
    cpu = [
        _node(
            f"cpu-{i}",
            {},
            {"cpu": "16", "memory": "64Gi", "pods": str(shape.pods_per_node)},
            [dict(FAKE_TAINT)] if shape.taint_fakes else [],
        )
        for i in range(shape.cpu_nodes)
    ]
    return gpu + cpu
