"""The sidecar's workers: spec.sidecar.workers when set, else one, whatever the profile and GPUs (workers
split a key's limits and the engine's slots as replicas do: a pod takes them only when asked)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.testdata import model_server

CPU = {"profile": "cpu", "model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M"}
EXTERNAL = {"profile": "external", "model": "llama3.2:1b", "external": {"url": "http://10.0.0.5:11434"}}
LOW_LATENCY = {"profile": "low-latency"}


@pytest.mark.parametrize(
    ("spec", "workers"),
    [
        ({}, 1),
        ({"gpus": 16, "nodes": 2}, 1),
        ({**LOW_LATENCY, "gpus": 8}, 1),
        (CPU, 1),
        (EXTERNAL, 1),
        ({"gpus": 4, "sidecar": {}}, 1),  # the object without the field
        ({"gpus": 4, "sidecar": {"workers": 4}}, 4),
        ({"gpus": 16, "nodes": 2, "sidecar": {"workers": 16}}, 16),
        ({**CPU, "sidecar": {"workers": 3}}, 3),
        ({**EXTERNAL, "sidecar": {"workers": 2}}, 2),
    ],
)
def test_one_worker_unless_set(spec: dict[str, Any], workers: int) -> None:
    assert model_server(**spec).spec.sidecar_workers == workers
