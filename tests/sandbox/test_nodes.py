"""Where pods land in the sandbox: the fake nodes' taints with and without a real node, and the
patch that makes the real node advertise a GPU."""

from __future__ import annotations

from modelserve_sandbox.nodes import FAKE_TAINT, GPU_TAINT, NodeShape, node_manifests
from modelserve_sandbox.realnode import gpu_capacity_patch


def _taints(shape: NodeShape) -> dict[str, list[dict]]:
    return {n["metadata"]["name"]: n["spec"]["taints"] for n in node_manifests(shape)}


def test_kwok_alone_keeps_only_the_gpu_taint() -> None:
    assert _taints(NodeShape()) == {"gpu-0": [GPU_TAINT], "gpu-1": [GPU_TAINT], "cpu-0": []}


def test_beside_a_real_node_every_fake_node_is_opt_in() -> None:
    taints = _taints(NodeShape(taint_fakes=True))
    assert taints == {"gpu-0": [GPU_TAINT, FAKE_TAINT], "gpu-1": [GPU_TAINT, FAKE_TAINT], "cpu-0": [FAKE_TAINT]}


def test_the_gpu_patch_escapes_the_resource_name() -> None:
    assert gpu_capacity_patch(1) == [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "1"}]
