"""The sidecar's workers: spec.sidecar.workers when set, else one per 12k token events/s the engine's
GPUs stream (vLLM 6k per GPU, SGLang 25k), at least 1 and at most 8."""

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
        ({"gpus": 2}, 1),
        ({"gpus": 4}, 2),
        ({"gpus": 8}, 4),
        ({"gpus": 16, "nodes": 2}, 8),  # the leader's sidecar relays the whole group's tokens
        (LOW_LATENCY, 3),
        ({**LOW_LATENCY, "gpus": 2}, 5),
        ({**LOW_LATENCY, "gpus": 8}, 8),
        (CPU, 1),
        (EXTERNAL, 1),
        ({"gpus": 4, "sidecar": {}}, 2),  # the object without the field
        ({**LOW_LATENCY, "sidecar": {"workers": 1}}, 1),
        ({"gpus": 4, "sidecar": {"workers": 4}}, 4),
        ({"gpus": 16, "nodes": 2, "sidecar": {"workers": 16}}, 16),
        ({**CPU, "sidecar": {"workers": 3}}, 3),
        ({**EXTERNAL, "sidecar": {"workers": 2}}, 2),
    ],
)
def test_the_workers_follow_the_gpus_token_rate_unless_set(spec: dict[str, Any], workers: int) -> None:
    assert model_server(**spec).spec.sidecar_workers == workers
