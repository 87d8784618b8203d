"""A tiny random-weight chat model in Hugging Face's layout, for vLLM to load in the sandbox.

No hub is reachable, and no package ships a transformers-format model small enough to run on
two shared cores, so the sandbox makes one: a two-layer Llama with a 128-wide hidden state (a
head size of 64, which vLLM's CPU attention takes; it refuses 16), seeded random weights in
safetensors, a byte-level BPE tokenizer trained here on a few lines of text, and a ChatML chat
template (`<|im_start|>`, `<|im_end|>`: the seed's markers). Its answers are noise; everything
around them (download, load, tokenize, template, sample, stream, metrics) is the engine's real
path. It is served under its own hub id, never a real model's.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import lora_adapter

REPO = "modelserve/tiny-random-chatml"
BOS, EOS, IM_START, IM_END = "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END)
VOCAB_SIZE = 512
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 128, 2, 2, 1, 256
MAX_POSITIONS = 2048
SEED = 22
# ChatML, rendered by the engine's Jinja: the system/user/assistant turns between the markers,
# and the assistant's opening when a reply is wanted. List content is joined as text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# What the tokenizer learns its merges from: enough English for short words to be one token.
TRAINING_TEXT = """\
The capital of France is Paris. Hello, how are you today? I am fine, thank you.
What is the weather like? It is sunny and warm. Tell me a short story about a cat.
Once upon a time there was a small model that answered every question with noise.
You are a helpful assistant. Answer the question in one sentence. What time is it?
The quick brown fox jumps over the lazy dog. Count from one to ten: one two three four
five six seven eight nine ten. Write a haiku about the sea. Kubernetes serves models.
"""


def config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(IM_END),
        "pad_token_id": SPECIAL_TOKENS.index(EOS),
    }


def generation_config() -> dict:
    # A chat turn ends at <|im_end|>; <|endoftext|> ends a document.
    return {
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": [SPECIAL_TOKENS.index(IM_END), SPECIAL_TOKENS.index(EOS)],
    }


def tokenizer_json() -> str:
    """A byte-level BPE of VOCAB_SIZE tokens, the special tokens first (ids 0-3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT.splitlines(), trainer=trainer)
    return tokenizer.to_str()


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": IM_END,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def weights() -> dict:
    """Llama's tensors by their transformers names, seeded normal noise (float32)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    head_dim = HIDDEN // HEADS

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": noise(VOCAB_SIZE, HIDDEN), "lm_head.weight": noise(VOCAB_SIZE, HIDDEN)}
    tensors["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.self_attn.q_proj.weight": noise(HEADS * head_dim, HIDDEN),
            f"{prefix}.self_attn.k_proj.weight": noise(KV_HEADS * head_dim, HIDDEN),
            f"{prefix}.self_attn.v_proj.weight": noise(KV_HEADS * head_dim, HIDDEN),
            f"{prefix}.self_attn.o_proj.weight": noise(HIDDEN, HEADS * head_dim),
            f"{prefix}.mlp.gate_proj.weight": noise(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.up_proj.weight": noise(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.down_proj.weight": noise(HIDDEN, INTERMEDIATE),
            f"{prefix}.input_layernorm.weight": np.ones(HIDDEN, dtype=np.float32),
            f"{prefix}.post_attention_layernorm.weight": np.ones(HIDDEN, dtype=np.float32),
        }
    return tensors


def build(directory: Path) -> list[Path]:
    """Writes the model's files into `directory` (made if absent) and returns their paths.
    The same bytes every time, so the mirror's commit id for the repository is stable."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    texts = {
        "config.json": json.dumps(config(), indent=2, sort_keys=True),
        "generation_config.json": json.dumps(generation_config(), indent=2, sort_keys=True),
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2, sort_keys=True),
    }
    for name, text in texts.items():
        (directory / name).write_text(text)
    save_file(weights(), str(directory / "model.safetensors"), metadata={"format": "pt"})
    return [directory / name for name in (*texts, "model.safetensors")]


# A LoRA adapter made for this model, in PEFT's layout (what vLLM's and SGLang's loaders read):
# rank 8 on every attention and MLP projection of both layers, seeded, with deltas several times
# the base weights' size, so that greedy answers with the adapter differ from the base's.
ADAPTER_REPO = "modelserve/tiny-random-chatml-lora"
ADAPTER_RANK, ADAPTER_ALPHA = 8, 16
ADAPTER_SEED = 24
ADAPTER_STD = 0.2


def build_adapter(directory: Path) -> list[Path]:
    """Writes the adapter's two files into `directory` (lora_adapter.py); the same bytes every time."""
    return lora_adapter.build(
        directory, REPO, config(), rank=ADAPTER_RANK, alpha=ADAPTER_ALPHA, seed=ADAPTER_SEED, std=ADAPTER_STD
    )
