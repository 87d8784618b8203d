"""The tiny chat model the sandbox makes for vLLM: stable bytes, a working tokenizer, weights
that match the config. vLLM itself loads it in tests/realnode/test_vllm_on_node.py."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from modelserve_sandbox import tiny_model
from tests.helpers.lora_deltas import delta_to_weight_ratios


def test_the_same_bytes_every_time(tmp_path: Path) -> None:
    first = {p.name: p.read_bytes() for p in tiny_model.build(tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in tiny_model.build(tmp_path / "b")}
    assert first == second
    assert set(first) == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    }


def test_the_tokenizer_keeps_the_chatml_markers_whole(tmp_path: Path) -> None:
    tiny_model.build(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    # The corpus is too short for every merge: the embedding has room for each id it makes.
    assert 256 < tokenizer.get_vocab_size() <= tiny_model.VOCAB_SIZE
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == tokenizer.token_to_id("<|im_start|>") == 2
    assert tokenizer.token_to_id("<|im_end|>") in encoding.ids
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert "'<|im_start|>' + message['role']" in config["chat_template"]
    assert "'<|im_start|>assistant\\n'" in config["chat_template"]


def test_the_weights_have_the_shapes_the_config_names(tmp_path: Path) -> None:
    tiny_model.build(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    assert head_dim == 64  # vLLM's CPU attention refuses small head sizes such as 16
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], hidden)
    assert tensors["lm_head.weight"].shape == (config["vocab_size"], hidden)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        assert tensors[f"{prefix}.self_attn.q_proj.weight"].shape == (config["num_attention_heads"] * head_dim, hidden)
        assert tensors[f"{prefix}.self_attn.k_proj.weight"].shape == (config["num_key_value_heads"] * head_dim, hidden)
        assert tensors[f"{prefix}.mlp.down_proj.weight"].shape == (hidden, config["intermediate_size"])
    assert len(tensors) == 3 + 9 * config["num_hidden_layers"]


def test_the_adapter_fits_the_model_and_is_stable(tmp_path: Path) -> None:
    first = {p.name: p.read_bytes() for p in tiny_model.build_adapter(tmp_path / "a")}
    assert first == {p.name: p.read_bytes() for p in tiny_model.build_adapter(tmp_path / "b")}
    tiny_model.build(tmp_path / "model")
    base = load_file(str(tmp_path / "model" / "model.safetensors"))
    lora = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == tiny_model.REPO
    ratios = delta_to_weight_ratios(base, lora, config)
    # Large beside the base weights: greedy answers change with the adapter.
    assert all(ratio > 3 for ratio in ratios.values()), ratios
    assert len(ratios) == len(lora) // 2 == 7 * tiny_model.LAYERS
