"""Ollama's Modelfile as a ModelServer manifest, for `modelserve create NAME -f Modelfile`.

Pure functions: text in, a manifest dict (and warnings) out. The manifest is validated by the
caller with the spec model, so a value out of range is refused naming the spec field.

What maps, what is dropped with a warning (it only changed how Ollama ran on one machine, not
the answers) and what is refused (it changes the answers and no ModelServer field says it):
see PARAMETERS, DROPPED_PARAMETERS, REFUSED_PARAMETERS and DIRECTIVES below, and docs/how-to/from-ollama.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from modelserve.contracts.names import API_VERSION, KIND

from . import chat_template

# Ollama PARAMETER -> (samplingDefaults field, type)
PARAMETERS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("topK", int),
    "top_p": ("topP", float),
    "min_p": ("minP", float),
    "repeat_penalty": ("repetitionPenalty", float),
    "num_predict": ("maxTokens", int),
    "stop": ("stop", str),  # repeatable: a list
}
# How Ollama ran the model locally; the cluster decides these from the ModelServer instead.
DROPPED_PARAMETERS = dict.fromkeys(
    ("num_gpu", "num_thread", "num_batch", "main_gpu", "low_vram", "use_mmap", "use_mlock", "numa"),
    "how Ollama runs the model on its machine; the ModelServer's gpus, resources and engineArgs decide that",
)
# They change the answers and no spec field carries them: refused rather than silently lost.
REFUSED_PARAMETERS = {
    "num_ctx": "set spec.maxModelLen in the manifest instead (the engine's context length, "
    "a hard limit for every request)",
    "seed": "no samplingDefaults field; send seed with each request",
    "presence_penalty": "no samplingDefaults field; send presence_penalty with each request",
    "frequency_penalty": "no samplingDefaults field; send frequency_penalty with each request",
    "mirostat": "the engines behind a ModelServer offer no Mirostat sampling default",
    "mirostat_eta": "the engines behind a ModelServer offer no Mirostat sampling default",
    "mirostat_tau": "the engines behind a ModelServer offer no Mirostat sampling default",
    "repeat_last_n": "no samplingDefaults field (the engines choose the penalty window)",
    "tfs_z": "no samplingDefaults field (tail-free sampling)",
    "typical_p": "no samplingDefaults field (typical sampling)",
    "penalize_newline": "no samplingDefaults field",
    "num_keep": "no ModelServer field (tokens kept when the context shifts)",
}
# Directives other than FROM, TEMPLATE and PARAMETER: None drops with a warning, a text refuses.
DIRECTIVES: dict[str, str | None] = {
    "SYSTEM": "a ModelServer has no default system prompt: send it as the first message of each request",
    "MESSAGE": "a ModelServer has no default conversation: send the messages with each request",
    "ADAPTER": "a ModelServer serves no LoRA adapter: merge it into the model and publish that repo",
    "LICENSE": None,  # the license travels with the model repo
    "REQUIRES": None,  # the Ollama version a model needs
}
# Ollama's hub prefixes for Hugging Face repos: `hf.co/org/repo:quant` is the repo id `org/repo:quant`.
HF_PREFIXES = ("hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9._-]+)?$")


class ModelfileError(ValueError):
    """A Modelfile this CLI cannot turn into a ModelServer; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    command: str  # upper case: FROM, PARAMETER, TEMPLATE, ...
    args: str  # PARAMETER's name, MESSAGE's role, else ""
    value: str
    line: int  # where the instruction starts (a TEMPLATE's text too: line numbers count from it)


@dataclass
class Created:
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # spec field path -> Modelfile line it came from, to name the line when validation refuses it
    origins: dict[str, int] = field(default_factory=dict)


def _unquote(rest: str, lines: list[str], index: int) -> tuple[str, int]:
    """A value: `\"\"\"...\"\"\"` (may span lines), `"..."` or the rest of the line.
    Returns the value and the index of the line it ends on."""
    number = index + 1
    if rest.startswith('"""'):
        text = rest[3:]
        while '"""' not in text:
            index += 1
            if index >= len(lines):
                raise ModelfileError(f'line {number}: """ is never closed')
            text += "\n" + lines[index]
        value, _, after = text.partition('"""')
        if after.strip():
            raise ModelfileError(f'line {index + 1}: unexpected text after the closing """: {after.strip()}')
        return value, index
    if rest.startswith('"'):
        match = re.fullmatch(r'"((?:[^"\\]|\\.)*)"\s*', rest)
        if not match:
            raise ModelfileError(f'line {number}: a value opened with " is not closed on its line')
        return re.sub(r"\\(.)", r"\1", match.group(1)), index
    return rest.strip(), index


def parse(text: str) -> list[Instruction]:
    """The instructions of a Modelfile, in order (comments and blank lines left out)."""
    lines = text.splitlines()
    out: list[Instruction] = []
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        number = index + 1
        if not stripped or stripped.startswith("#"):
            index += 1
            continue
        command, _, rest = stripped.partition(" ")
        command, rest = command.upper(), rest.strip()
        if command not in ("FROM", "TEMPLATE", "PARAMETER", *DIRECTIVES):
            raise ModelfileError(f"line {number}: unknown instruction {command}")
        args = ""
        if command in ("PARAMETER", "MESSAGE"):
            args, _, rest = rest.partition(" ")
            rest = rest.strip()
            if not args or not rest:
                what = "a name and a value" if command == "PARAMETER" else "a role and a text"
                raise ModelfileError(f"line {number}: {command} takes {what}")
        value, index = _unquote(rest, lines, index)
        out.append(Instruction(command, args, value, number))
        index += 1
    return out


def model_id(value: str, line: int) -> str:
    """FROM's value as a Hugging Face repo id; local files and Ollama library names are refused."""
    for prefix in HF_PREFIXES:
        if value.startswith(prefix):
            value = value[len(prefix) :]
            break
    if value.startswith(("/", ".", "~")) or value.endswith((".gguf", ".bin", ".safetensors")):
        raise ModelfileError(
            f"line {line}: FROM {value} is a file on this machine, which a cluster cannot serve: "
            "use a Hugging Face repo id (e.g. unsloth/gemma-3-270m-it-GGUF:Q4_K_M or LiquidAI/LFM2-1.2B)"
        )
    if not HUB_ID.match(value):
        raise ModelfileError(
            f"line {line}: FROM {value} is not a Hugging Face repo id <org>/<name>[:<quant>] "
            "(names from Ollama's library are not served from a cluster): use a Hugging Face repo id "
            "(e.g. unsloth/gemma-3-270m-it-GGUF:Q4_K_M or LiquidAI/LFM2-1.2B)"
        )
    return value


def _number(instruction: Instruction, kind: type) -> int | float:
    try:
        return kind(instruction.value)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ModelfileError(
            f"line {instruction.line}: PARAMETER {instruction.args} takes {noun}, not {instruction.value!r}"
        ) from None


def _parameter(instruction: Instruction, sampling: dict[str, Any], seen: dict[str, int], created: Created) -> None:
    name, line = instruction.args, instruction.line
    if name in DROPPED_PARAMETERS:
        created.warnings.append(f"line {line}: PARAMETER {name} ignored: {DROPPED_PARAMETERS[name]}")
        return
    if name in REFUSED_PARAMETERS:
        raise ModelfileError(f"line {line}: PARAMETER {name} is not supported: {REFUSED_PARAMETERS[name]}")
    if name not in PARAMETERS:
        known = ", ".join(PARAMETERS)
        raise ModelfileError(f"line {line}: unknown PARAMETER {name} (those that map to samplingDefaults: {known})")
    spec_field, kind = PARAMETERS[name]
    created.origins[f"spec.samplingDefaults.{spec_field}"] = line
    if name == "stop":
        sampling.setdefault("stop", []).append(instruction.value)
        return
    if name in seen:
        raise ModelfileError(f"line {line}: PARAMETER {name} is set again (first on line {seen[name]})")
    seen[name] = line
    value = _number(instruction, kind)
    if name == "num_predict" and value in (-1, -2):
        return  # Ollama's "unlimited": no maxTokens default
    sampling[spec_field] = value


def to_manifest(text: str, name: str, profile: str | None = None, namespace: str | None = None) -> Created:
    """The ModelServer a Modelfile describes (not yet validated: the caller runs the spec model)."""
    created = Created({})
    spec: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for instruction in parse(text):
        command, line = instruction.command, instruction.line
        if command in ("FROM", "TEMPLATE"):
            if command in seen:
                raise ModelfileError(f"line {line}: {command} is given again (first on line {seen[command]})")
            seen[command] = line
        if command == "FROM":
            spec["model"] = model_id(instruction.value, line)
            created.origins["spec.model"] = line
        elif command == "TEMPLATE":
            try:
                spec["chatTemplate"] = chat_template.to_jinja(instruction.value, line)
            except chat_template.TemplateError as error:
                raise ModelfileError(f"TEMPLATE {error}") from None
            created.origins["spec.chatTemplate"] = line
        elif command == "PARAMETER":
            _parameter(instruction, sampling, seen, created)
        elif DIRECTIVES[command] is None:
            created.warnings.append(f"line {line}: {command} ignored: it does not change how the model is served")
        else:
            raise ModelfileError(f"line {line}: {command} is not supported: {DIRECTIVES[command]}")
    if "model" not in spec:
        raise ModelfileError("no FROM line: a Modelfile names its model with FROM <Hugging Face repo id>")
    if profile is None and ":" in spec["model"]:
        profile = "cpu"  # a :<quant> tag names a GGUF file: only the cpu profile (llama.cpp) serves one
    if profile:
        spec["profile"] = profile
    if sampling:
        spec["samplingDefaults"] = sampling
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    # Keys in the order a person writes them: model, profile, samplingDefaults, chatTemplate.
    order = ("model", "profile", "samplingDefaults", "chatTemplate")
    created.manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {key: spec[key] for key in order if key in spec},
    }
    return created
