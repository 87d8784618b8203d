"""Modelfiles as ModelServer manifests, and Ollama's Go templates as Jinja (pure functions).

jinja2 is not installed here (and is no dependency): these tests check the Jinja's text; the
rendering, by llama.cpp's own template engine, is in tests/cli/test_cli_engine.py.
"""

from __future__ import annotations

import pytest

from modelserve.cli import chat_template, modelfile
from modelserve.cli.chat_template import Field, If, Range, TemplateError, Text
from modelserve.cli.modelfile import Instruction, ModelfileError

SEED_TEMPLATE = (
    "<|startoftext|>{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"
)
SEED_MODELFILE = f'''# the seed's example
FROM unsloth/gemma-3-270m-it-GGUF:Q4_K_M
TEMPLATE """{SEED_TEMPLATE}"""
PARAMETER temperature 0.1
PARAMETER top_k 50
PARAMETER repeat_penalty 1.05
PARAMETER stop "<|im_end|>"
PARAMETER stop <|endoftext|>
'''


def create(text: str, **kwargs: str) -> modelfile.Created:
    return modelfile.to_manifest(text, "chatty", **kwargs)


def refusal(text: str) -> str:
    with pytest.raises(ModelfileError) as error:
        create(text)
    return str(error.value)


# --- parsing --------------------------------------------------------------------------------------


def test_parse_reads_commands_quotes_and_multiline_values() -> None:
    assert modelfile.parse(SEED_MODELFILE) == [
        Instruction("FROM", "", "unsloth/gemma-3-270m-it-GGUF:Q4_K_M", 2),
        Instruction("TEMPLATE", "", SEED_TEMPLATE, 3),
        Instruction("PARAMETER", "temperature", "0.1", 9),
        Instruction("PARAMETER", "top_k", "50", 10),
        Instruction("PARAMETER", "repeat_penalty", "1.05", 11),
        Instruction("PARAMETER", "stop", "<|im_end|>", 12),
        Instruction("PARAMETER", "stop", "<|endoftext|>", 13),
    ]
    # Commands are case-insensitive, as Ollama reads them; "..." takes escaped quotes.
    assert modelfile.parse('from a/b\nparameter stop "say \\"bye\\""') == [
        Instruction("FROM", "", "a/b", 1),
        Instruction("PARAMETER", "stop", 'say "bye"', 2),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('FROM a/b\nTEMPLATE """never closed\n', 'line 2: """ is never closed'),
        ('FROM a/b\nPARAMETER stop "open', 'line 2: a value opened with " is not closed on its line'),
        ("FROM a/b\nPARAMETER temperature", "line 2: PARAMETER takes a name and a value"),
        ("FROM a/b\nQUANTIZE q4", "line 2: unknown instruction QUANTIZE"),
    ],
)
def test_parse_refuses_broken_files_naming_the_line(text: str, says: str) -> None:
    assert refusal(text) == says


# --- the mapping ----------------------------------------------------------------------------------


def test_the_seed_modelfile_maps_to_model_sampling_defaults_and_template() -> None:
    created = create(SEED_MODELFILE, profile="cpu", namespace="serving")
    assert created.warnings == []
    spec = created.manifest.pop("spec")
    assert created.manifest == {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "chatty", "namespace": "serving"},
    }
    assert list(spec) == ["model", "profile", "samplingDefaults", "chatTemplate"]
    assert spec["model"] == "unsloth/gemma-3-270m-it-GGUF:Q4_K_M" and spec["profile"] == "cpu"
    assert spec["samplingDefaults"] == {
        "temperature": 0.1,
        "topK": 50,
        "repetitionPenalty": 1.05,
        "stop": ["<|im_end|>", "<|endoftext|>"],
    }
    assert spec["chatTemplate"] == chat_template.to_jinja(SEED_TEMPLATE, 3)
    assert created.origins["spec.samplingDefaults.temperature"] == 9
    assert created.origins["spec.chatTemplate"] == 3


def test_every_mapped_parameter_lands_in_its_samplingdefaults_field() -> None:
    text = "FROM a/b\n" + "\n".join(
        f"PARAMETER {name} {value}"
        for name, value in [("top_p", "0.9"), ("min_p", "0.15"), ("num_predict", "512"), ("temperature", "0")]
    )
    assert create(text).manifest["spec"]["samplingDefaults"] == {
        "topP": 0.9,
        "minP": 0.15,
        "maxTokens": 512,
        "temperature": 0.0,
    }
    # Ollama's "unlimited" predictions: no maxTokens default at all.
    assert "samplingDefaults" not in create("FROM a/b\nPARAMETER num_predict -1").manifest["spec"]


@pytest.mark.parametrize(
    ("source", "model"),
    [
        ("LiquidAI/LFM2-1.2B", "LiquidAI/LFM2-1.2B"),
        ("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "unsloth/gemma-3-270m-it-GGUF:Q4_K_M"),
        ("https://huggingface.co/LiquidAI/LFM2-1.2B", "LiquidAI/LFM2-1.2B"),
    ],
)
def test_from_takes_hub_ids_and_ollamas_hf_prefixes(source: str, model: str) -> None:
    spec = create(f"FROM {source}").manifest["spec"]
    assert spec["model"] == model
    # A :<quant> tag names a GGUF file: the cpu profile unless --profile says otherwise.
    assert spec.get("profile") == ("cpu" if ":" in model else None)


@pytest.mark.parametrize("source", ["./gemma.gguf", "/models/gemma.gguf", "~/m.gguf", "gemma.gguf"])
def test_from_a_local_file_is_refused(source: str) -> None:
    assert refusal(f"# x\nFROM {source}") == (
        f"line 2: FROM {source} is a file on this machine, which a cluster cannot serve: use a Hugging Face "
        "repo id (e.g. unsloth/gemma-3-270m-it-GGUF:Q4_K_M or LiquidAI/LFM2-1.2B)"
    )


def test_from_an_ollama_library_name_is_refused() -> None:
    assert refusal("FROM llama3.2:1b").startswith(
        "line 1: FROM llama3.2:1b is not a Hugging Face repo id <org>/<name>[:<quant>]"
    )
    assert refusal("PARAMETER top_k 5") == (
        "no FROM line: a Modelfile names its model with FROM <Hugging Face repo id>"
    )
    assert refusal("FROM a/b\nFROM c/d") == "line 2: FROM is given again (first on line 1)"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            "PARAMETER num_ctx 4096",
            "PARAMETER num_ctx is not supported: set spec.maxModelLen in the manifest instead "
            "(the engine's context length, a hard limit for every request)",
        ),
        (
            "PARAMETER mirostat 2",
            "PARAMETER mirostat is not supported: the engines behind a ModelServer offer no Mirostat sampling default",
        ),
        (
            "PARAMETER seed 42",
            "PARAMETER seed is not supported: no samplingDefaults field; send seed with each request",
        ),
        (
            "PARAMETER flux 1",
            "unknown PARAMETER flux (those that map to samplingDefaults: temperature, top_k, "
            "top_p, min_p, repeat_penalty, num_predict, stop)",
        ),
        ("PARAMETER temperature hot", "PARAMETER temperature takes a number, not 'hot'"),
        ("PARAMETER top_k 0.5", "PARAMETER top_k takes an integer, not '0.5'"),
        (
            "SYSTEM You are a pirate.",
            "SYSTEM is not supported: a ModelServer has no default system prompt: "
            "send it as the first message of each request",
        ),
        (
            "ADAPTER ./lora.gguf",
            "ADAPTER is not supported: a ModelServer serves no LoRA adapter: merge it into the model and publish "
            "that repo",
        ),
        (
            "MESSAGE user Hi",
            "MESSAGE is not supported: a ModelServer has no default conversation: send the messages with each request",
        ),
    ],
)
def test_what_changes_answers_without_a_spec_field_is_refused(line: str, says: str) -> None:
    assert refusal(f"FROM a/b\n{line}") == f"line 2: {says}"


def test_a_parameter_set_twice_is_refused_but_stop_repeats() -> None:
    assert refusal("FROM a/b\nPARAMETER top_k 5\nPARAMETER top_k 6") == (
        "line 3: PARAMETER top_k is set again (first on line 2)"
    )


def test_what_only_changed_how_ollama_ran_is_dropped_with_a_warning() -> None:
    created = create('FROM a/b\nPARAMETER num_thread 8\nLICENSE """MIT\n"""\nPARAMETER num_gpu 1')
    assert created.manifest["spec"] == {"model": "a/b"}
    assert created.warnings == [
        "line 2: PARAMETER num_thread ignored: how Ollama runs the model on its machine; "
        "the ModelServer's gpus, resources and engineArgs decide that",
        "line 3: LICENSE ignored: it does not change how the model is served",
        "line 5: PARAMETER num_gpu ignored: how Ollama runs the model on its machine; "
        "the ModelServer's gpus, resources and engineArgs decide that",
    ]


# --- Go template -> Jinja -------------------------------------------------------------------------


def test_parse_builds_the_template_tree_with_go_trimming() -> None:
    assert chat_template.parse(SEED_TEMPLATE) == [
        Text("<|startoftext|>"),
        If(
            Field("System", 1),
            [Text("<|im_start|>system\n"), Field("System", 2), Text("<|im_end|>\n")],
        ),
        Text("<|im_start|>user\n"),
        Field("Prompt", 4),
        Text("<|im_end|>\n<|im_start|>assistant\n"),
    ]
    trimmed = "{{- range .Messages }}\n  {{ .Role }}: {{ .Content -}}\n\n{{ end }}{{/* done */}}"
    assert chat_template.parse(trimmed) == [Range(1, [Text("\n  "), Field("Role", 2), Text(": "), Field("Content", 2)])]


def test_the_seed_template_becomes_an_ollama_exchange_loop() -> None:
    # The ChatML-like layout: each literal an escaped Jinja string, nothing between the tags.
    turn = (
        "{{ '<|startoftext|>' }}{% if ns.system %}{{ '<|im_start|>system\\n' }}{{ ns.system }}"
        "{{ '<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>user\\n' }}{{ ns.prompt }}"
        "{{ '<|im_end|>\\n<|im_start|>assistant\\n' }}"
    )
    reset = "{% set ns.system = '' %}{% set ns.prompt = '' %}{% set ns.response = '' %}"
    assert chat_template.to_jinja(SEED_TEMPLATE) == (
        "{% set ns = namespace(system='', prompt='', response='') %}"
        "{% for message in messages %}"
        "{% if message.role == 'system' %}{% if ns.prompt or ns.response %}" + turn + reset + "{% endif %}"
        "{% set ns.system = message.content %}"
        "{% elif message.role == 'user' %}{% if ns.response %}" + turn + reset + "{% endif %}"
        "{% set ns.prompt = message.content %}"
        "{% elif message.role == 'assistant' %}{% set ns.response = message.content %}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}" + turn + "{% else %}" + turn + "{% endif %}"
    )
    assert "\n" not in chat_template.to_jinja(SEED_TEMPLATE)  # trim_blocks has nothing to trim


def test_the_last_exchange_stops_at_response_as_ollama_cuts_it() -> None:
    nodes = chat_template.parse("{{ .Prompt }}>{{ if .Response }}{{ .Response }}<end>{{ else }}x{{ end }}after")
    cut, did_cut = chat_template.cut_at_response(nodes)
    assert did_cut and cut == [Field("Prompt", 1), Text(">"), If(Field("Response", 1), [], [])]
    full = chat_template.to_jinja("U:{{ .Prompt }}\nA:{{ .Response }}\n")
    assert full.endswith(
        "{% if add_generation_prompt %}{{ 'U:' }}{{ ns.prompt }}{{ '\\nA:' }}"
        "{% else %}{{ 'U:' }}{{ ns.prompt }}{{ '\\nA:' }}{{ ns.response }}{{ '\\n' }}{% endif %}"
    )


def test_the_messages_form_loops_over_messages_with_the_generation_prompt_last() -> None:
    template = "{{ if .System }}S:{{ .System }}\n{{ end }}{{ range .Messages }}{{ .Role }}: {{ .Content }}\n{{ end }}A:"
    assert chat_template.to_jinja(template) == (
        chat_template.JOINED_SYSTEM + "{% if ns.system %}{{ 'S:' }}{{ ns.system }}{{ '\\n' }}{% endif %}"
        "{% for message in messages %}{{ message.role }}{{ ': ' }}{{ message.content }}{{ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'A:' }}{% endif %}"
    )


def test_literals_are_escaped_for_jinja() -> None:
    assert chat_template.jinja_string('it\'s a \\ "q"\n\t') == "'it\\'s a \\\\ \"q\"\\n\\t'"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("a\n{{ .Prompt | json }}", "line 2: {{ .Prompt | json }} is not supported (a pipeline)"),
        ("{{ json .Prompt }}", "line 1: {{ json .Prompt }} is not supported (the function json)"),
        ("{{ if .Tools }}x{{ end }}", "line 1: {{ if .Tools }} is not supported (if over the field .Tools)"),
        ("{{ .Tools }}", "line 1: {{ .Tools }} is not supported (the field .Tools)"),
        ("{{ $x := .Prompt }}", "line 1: {{ $x := .Prompt }} is not supported (a variable)"),
        (
            "{{ range $i, $m := .Messages }}{{ end }}",
            "line 1: {{ range $i, $m := .Messages }} is not supported (a variable)",
        ),
        (
            '{{ range .Messages }}{{ if eq .Role "user" }}u{{ end }}{{ end }}',
            'line 1: {{ if eq .Role "user" }} is not supported (if over the function eq)',
        ),
        ("{{ with .System }}x{{ end }}", "line 1: {{ with .System }} is not supported (with over the field .System)"),
        (
            "{{ range .Messages }}\n{{ .System }}{{ end }}",
            "line 2: {{ .System }} is not supported (the field .System: inside range .Messages a message has only "
            ".Role and .Content)",
        ),
        ("{{ .Role }}", "line 1: {{ .Role }} is not supported (the field .Role: only inside range)"),
    ],
)
def test_other_go_template_constructs_are_refused_naming_them_and_the_line(template: str, says: str) -> None:
    with pytest.raises(TemplateError) as error:
        chat_template.to_jinja(template)
    assert str(error.value) == f"{says}; supported: {chat_template.SUPPORTED}"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ if .System }}x", "line 1: this {{ if }} or {{ range }} has no {{ end }}"),
        ("x{{ end }}", "line 1: {{ end }} has no open {{ if }} or {{ range }}"),
        ("x\n{{ .Prompt ", "line 2: an action opened with {{ is not closed with }}"),
        (
            "{{ .Prompt }}\n{{ range .Messages }}{{ end }}",
            "line 1: .Prompt next to range .Messages (line 2): Ollama fills one or the other, so use one form",
        ),
    ],
)
def test_broken_or_mixed_templates_are_refused(template: str, says: str) -> None:
    with pytest.raises(TemplateError) as error:
        chat_template.to_jinja(template)
    assert str(error.value) == says


def test_a_template_refusal_names_the_modelfile_line() -> None:
    text = 'FROM a/b\nPARAMETER top_k 5\nTEMPLATE """{{ .System }}\n{{ .Tools }}"""'
    assert refusal(text).startswith("TEMPLATE line 4: {{ .Tools }} is not supported (the field .Tools)")
