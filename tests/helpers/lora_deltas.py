"""What a LoRA adapter changes in its base model's weights, for the tests of the adapters the sandbox
makes (tiny_model.py, lora_adapter.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def delta_to_weight_ratios(
    base: Mapping[str, np.ndarray], lora: Mapping[str, np.ndarray], config: Mapping[str, Any]
) -> dict[str, float]:
    """For each base weight the adapter targets: the mean magnitude of its delta (B @ A, scaled by
    lora_alpha / r) over the weight's own. Asserts that A, B and the delta have the shapes PEFT loads."""
    ratios = {}
    for name, weight in base.items():
        if name.removesuffix(".weight").rsplit(".", 1)[-1] not in config["target_modules"]:
            continue
        prefix = "base_model.model." + name.removesuffix(".weight")
        a, b = lora[f"{prefix}.lora_A.weight"], lora[f"{prefix}.lora_B.weight"]
        assert a.shape[0] == b.shape[1] == config["r"], name
        delta = (b @ a) * config["lora_alpha"] / config["r"]
        assert delta.shape == weight.shape, name
        ratios[name] = float(abs(delta).mean() / abs(weight).mean())
    return ratios
