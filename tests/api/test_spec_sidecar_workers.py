"""The sidecar's workers: spec.sidecar.workers when set, else one per 12k token events/s the engine's
GPUs stream at full batch (by the model's size: engines/token_rates.py), at least 1 and at most 8."""

from __future__ import annotations

from typing import Any

import pytest

from harness.testdata import model_server

CPU = {"profile": "cpu", "model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M"}
EXTERNAL = {"profile": "external", "model": "llama3.2:1b", "external": {"url": "http://10.0.0.5:11434"}}
LOW_LATENCY = {"profile": "low-latency"}
LLAMA_8B = {"model": "meta-llama/Llama-3.1-8B-Instruct"}
LLAMA_70B = {"model": "meta-llama/Llama-3.1-70B-Instruct"}


@pytest.mark.parametrize(
    ("spec", "workers"),
    [
        ({}, 4),  # LFM2-1.2B: 40k tokens/s on one GPU (the small models' ceiling)
        ({"gpus": 2}, 7),
        ({"gpus": 16, "nodes": 2}, 8),  # the leader's sidecar relays the whole group's tokens
        (LLAMA_8B, 2),  # 12.5k tokens/s
        ({**LLAMA_8B, "gpus": 2}, 3),
        ({**LLAMA_70B, "gpus": 4}, 1),  # 1.4k per GPU
        ({**LLAMA_70B, "gpus": 8}, 1),
        ({"model": "LiquidAI/LFM2-8B-A1B"}, 4),  # 1B active
        ({"model": "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpus": 2}, 2),  # two 7B experts a token
        ({"model": "microsoft/phi-4"}, 2),  # no size in the name: as 8B
        ({**LOW_LATENCY, **LLAMA_8B}, 2),  # the same rates for SGLang
        ({**LOW_LATENCY, "gpus": 2}, 7),
        (CPU, 1),
        (EXTERNAL, 1),
        ({**LLAMA_8B, "sidecar": {}}, 2),  # the object without the field
        ({**LOW_LATENCY, "sidecar": {"workers": 1}}, 1),
        ({"gpus": 4, "sidecar": {"workers": 4}}, 4),
        ({"gpus": 16, "nodes": 2, "sidecar": {"workers": 16}}, 16),
        ({**CPU, "sidecar": {"workers": 3}}, 3),
        ({**EXTERNAL, "sidecar": {"workers": 2}}, 2),
    ],
)
def test_the_workers_follow_the_gpus_token_rate_unless_set(spec: dict[str, Any], workers: int) -> None:
    assert model_server(**spec).spec.sidecar_workers == workers
