"""A seeded random LoRA adapter in PEFT's layout (what vLLM's and SGLang's loaders read), made for a
Llama in Hugging Face's layout from its `config.json`.

No package ships an adapter for the models the sandbox serves, so it makes one: rank `rank` on every
attention and MLP projection of every layer, lora_A and lora_B both nonzero and large enough beside
the base weights that greedy answers with the adapter differ from the base's. It teaches nothing;
it is served under its own id, which says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(out, in) of each target projection of one layer, by its module path in the layer."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    return {
        "self_attn.q_proj": (q, hidden),
        "self_attn.k_proj": (kv, hidden),
        "self_attn.v_proj": (kv, hidden),
        "self_attn.o_proj": (hidden, q),
        "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden),
        "mlp.down_proj": (hidden, inner),
    }


def adapter_config(base_repo: str, rank: int, alpha: int) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_repo,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }


def adapter_weights(config: dict[str, Any], rank: int, seed: int, std: float) -> dict[str, Any]:
    """lora_A (rank x in) and lora_B (out x rank) per target, normal(0, std), under PEFT's names (float32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (out, inner) in projection_shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, inner)) * std).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out, rank)) * std).astype(np.float32)
    return tensors


def build(
    directory: Path, base_repo: str, config: dict[str, Any], *, rank: int, alpha: int, seed: int, std: float
) -> list[Path]:
    """Writes adapter_config.json and adapter_model.safetensors into `directory`; the same bytes
    for the same arguments."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(
        json.dumps(adapter_config(base_repo, rank, alpha), indent=2, sort_keys=True)
    )
    save_file(
        adapter_weights(config, rank, seed, std),
        str(directory / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    return [directory / "adapter_config.json", directory / "adapter_model.safetensors"]
