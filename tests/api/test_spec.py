"""The spec model: defaults, camelCase wire names, descriptions, and the same refusals as the CRD."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from harness.testdata import examples, invalid_cases
from modelserve.api import spec as spec_module
from modelserve.api.spec import AuthMode, Dtype, ModelServer, ModelServerSpec, Profile
from modelserve.engines import engine_for, sglang, vllm


def _manifest(spec: dict[str, Any], name: str = "m") -> dict[str, Any]:
    return {"apiVersion": spec_module.API_VERSION, "kind": "ModelServer", "metadata": {"name": name}, "spec": spec}


def test_defaults_describe_one_private_high_throughput_replica_on_one_gpu() -> None:
    spec = ModelServerSpec.model_validate({"model": "LiquidAI/LFM2-1.2B"})
    assert (spec.profile, spec.dtype, spec.gpu_count) == (Profile.HIGH_THROUGHPUT, Dtype.AUTO, 1)
    assert (spec.replicas.min, spec.replicas.buffer, spec.replicas.max) == (1, 0, 1)
    assert spec.auth.mode == AuthMode.PRIVATE and spec.auth.secret_name is None
    assert not spec.torch_compile and not spec.vision


def test_cpu_profile_defaults_to_no_gpu() -> None:
    spec = ModelServerSpec.model_validate({"model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "profile": "cpu"})
    assert spec.gpu_count == 0


def test_wire_form_is_camel_case_and_leaves_unset_fields_out() -> None:
    spec = ModelServerSpec.model_validate(
        {"model": "a/b", "maxModelLen": 1024, "samplingDefaults": {"topK": 50}, "hfTokenSecretRef": {"name": "hf"}}
    )
    wire = spec.to_wire()
    assert wire["maxModelLen"] == 1024 and wire["samplingDefaults"] == {"topK": 50}
    assert wire["hfTokenSecretRef"] == {"name": "hf", "key": "token"}
    assert "gpuMemoryUtilization" not in wire and "max_model_len" not in wire


def test_snake_case_names_are_refused_like_the_api_server_does() -> None:
    with pytest.raises(ValidationError, match="max_model_len"):
        ModelServerSpec.model_validate({"model": "a/b", "max_model_len": 1024})


def _wire_models() -> list[type[BaseModel]]:
    return [
        obj
        for obj in vars(spec_module).values()
        if isinstance(obj, type) and issubclass(obj, spec_module.WireModel) and obj is not spec_module.WireModel
    ]


@pytest.mark.parametrize("model", _wire_models(), ids=lambda m: m.__name__)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert not missing, f"{model.__name__} fields without description: {missing}"


@pytest.mark.parametrize("name", sorted(examples()))
def test_every_example_is_valid(name: str) -> None:
    ms = ModelServer.from_manifest(examples()[name])
    assert ms.name == examples()[name]["metadata"]["name"]


@pytest.mark.parametrize(("case_id", "manifest", "field", "says"), invalid_cases(), ids=[c[0] for c in invalid_cases()])
def test_the_model_refuses_what_the_api_server_refuses(
    case_id: str, manifest: dict[str, Any], field: str, says: tuple[str, ...]
) -> None:
    # The offline renderer must not accept a manifest `kubectl apply` would refuse, and says why.
    with pytest.raises(ValueError) as refused:
        ModelServer.from_manifest(manifest)
    assert re.sub(r"\[\d+\]", "", field).split(".")[-1] in str(refused.value)
    assert all(words in str(refused.value) for words in says), str(refused.value)


def test_catalog_is_at_least_twenty_cases_with_unique_ids() -> None:
    ids = [case[0] for case in invalid_cases()]
    assert len(ids) >= 20 and len(ids) == len(set(ids))


def test_rule_messages_name_their_field() -> None:
    for model in _wire_models():
        for rule in model.rules:
            assert rule.field.split(".")[-1] in rule.message, rule


def test_a_valid_low_latency_spec_with_every_tuning_flag_passes() -> None:
    spec = ModelServerSpec.model_validate(
        {
            "model": "LiquidAI/LFM2-8B-A1B",
            "profile": "low-latency",
            "gpus": 2,
            "torchCompile": True,
            "chunkedPrefillSize": -1,
            "toolCallParser": "lfm2",
            "replicas": {"min": 0, "buffer": 1, "max": 3},
            "cache": {"size": "100Gi", "storageClassName": "fast"},
            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            "resources": {"limits": {"memory": "64Gi"}, "requests": {"cpu": "8"}},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        }
    )
    assert spec.gpu_count == 2 and spec.cache and spec.cache.size == "100Gi"


@pytest.mark.parametrize(
    ("profile", "parsers"),
    [(Profile.HIGH_THROUGHPUT, vllm.TOOL_CALL_PARSERS), (Profile.LOW_LATENCY, sglang.TOOL_CALL_PARSERS)],
)
def test_every_parser_of_the_pinned_engine_is_accepted(profile: Profile, parsers: tuple[str, ...]) -> None:
    assert list(parsers) == sorted(set(parsers))  # one name once, in the order the message lists them
    for name in parsers:
        assert ModelServerSpec.model_validate({"model": "a/b", "profile": profile, "toolCallParser": name})


@pytest.mark.parametrize("profile", [Profile.HIGH_THROUGHPUT, Profile.LOW_LATENCY])
def test_every_offered_load_format_is_accepted_and_no_other(profile: Profile) -> None:
    offered = engine_for(profile).load_formats
    assert set(offered) == {"runai_streamer", "fastsafetensors"}
    for name in offered:
        spec = ModelServerSpec.model_validate({"model": "a/b", "profile": profile, "loadFormat": name})
        assert spec.load_format == name and spec.to_wire()["loadFormat"] == name
    # Loaders the engine has but we do not offer, and a name it lacks.
    for name in ("npcache", "auto", "runai_streamer_sharded", "turbo"):
        with pytest.raises(
            ValidationError, match=f"loadFormat must be runai_streamer or fastsafetensors for profile {profile}"
        ):
            ModelServerSpec.model_validate({"model": "a/b", "profile": profile, "loadFormat": name})


@pytest.mark.parametrize("arg", [["--load-format", "pt"], ["--load-format=pt"], ["--load-f", "pt"]])
@pytest.mark.parametrize("profile", [Profile.HIGH_THROUGHPUT, Profile.LOW_LATENCY])
def test_load_format_and_the_flag_in_engine_args_are_not_both_set(profile: Profile, arg: list[str]) -> None:
    spec = {"model": "a/b", "profile": profile, "engineArgs": arg}
    assert ModelServerSpec.model_validate(spec).engine_args == arg  # the flag alone is the user's
    with pytest.raises(
        ValidationError, match=f"loadFormat and --load-format in engineArgs must not both be set with profile {profile}"
    ):
        ModelServerSpec.model_validate({**spec, "loadFormat": "runai_streamer"})


def test_vllm_reads_the_load_format_flag_with_underscores_too() -> None:
    with pytest.raises(ValidationError, match="with _ for -"):
        ModelServerSpec.model_validate(
            {"model": "a/b", "loadFormat": "runai_streamer", "engineArgs": ["--load_format=pt"]}
        )
    # SGLang's parser has no `_` spelling: the flag is not --load-format to it (it exits on it at start).
    low = {"model": "a/b", "profile": "low-latency", "loadFormat": "runai_streamer", "engineArgs": ["--load_format=pt"]}
    assert ModelServerSpec.model_validate(low).load_format == "runai_streamer"


def test_cpu_refuses_a_load_format_naming_what_the_gpu_profiles_take() -> None:
    cpu = {"model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "profile": "cpu"}
    with pytest.raises(ValidationError) as refused:
        ModelServerSpec.model_validate({**cpu, "loadFormat": "fastsafetensors"})
    assert "loadFormat does not apply to profile cpu" in str(refused.value)
    assert f"with profile high-throughput (vLLM {vllm.VERSION})" in str(refused.value)
    assert f"with profile low-latency (SGLang {sglang.VERSION})" in str(refused.value)


def test_names_must_be_dns_labels() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        ModelServer.from_manifest(_manifest({"model": "a/b"}, name="a" * 64))
    assert ModelServer.from_manifest(_manifest({"model": "a/b"}, name="a" * 63)).name == "a" * 63


def test_a_chat_template_is_bounded_well_inside_a_config_map() -> None:
    # 4 bytes per character at worst in UTF-8: the ConfigMap stays under its 1 MiB.
    assert spec_module.CHAT_TEMPLATE_MAX_LENGTH * 4 < 1024 * 1024
    limit = spec_module.CHAT_TEMPLATE_MAX_LENGTH
    assert ModelServerSpec.model_validate({"model": "a/b", "chatTemplate": "x" * limit}).chat_template
    with pytest.raises(ValidationError, match="chatTemplate"):
        ModelServerSpec.model_validate({"model": "a/b", "chatTemplate": "x" * (limit + 1)})


EXTERNAL = {"profile": "external", "model": "llama3.2:1b", "external": {"url": "http://10.88.0.1:11434"}}
# A value for each field that configures an engine, which profile external refuses by name.
ENGINE_VALUES = {
    "gpus": 1,
    "dtype": "float16",
    "maxModelLen": 4096,
    "gpuMemoryUtilization": 0.5,
    "toolCallParser": "hermes",
    "loadFormat": "runai_streamer",
    "chatTemplate": "{{ messages }}",
    "hfTokenSecretRef": {"name": "hf"},
    "cache": {"size": "10Gi"},
    "image": "ollama/ollama",
    "engineArgs": ["--verbose"],
    "env": [{"name": "A", "value": "1"}],
    "resources": {"requests": {"cpu": "1"}},
    "shmSize": "1Gi",
}


def test_an_external_server_needs_no_engine_fields_and_takes_its_own_model_ids() -> None:
    spec = ModelServerSpec.model_validate(EXTERNAL)
    assert spec.gpu_count == 0 and spec.external and spec.external.url == "http://10.88.0.1:11434"
    for model in ("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "mlx-community/Qwen3-4B-4bit", "qwen2.5@q4"):
        assert ModelServerSpec.model_validate({**EXTERNAL, "model": model}).model == model
    # Empty lists configure nothing.
    assert ModelServerSpec.model_validate({**EXTERNAL, "engineArgs": [], "env": []})


def test_the_refused_fields_are_exactly_the_engine_fields() -> None:
    assert set(ENGINE_VALUES) == {wire for wire, _, _ in spec_module.ENGINE_FIELDS}


@pytest.mark.parametrize("field", sorted(ENGINE_VALUES))
def test_external_refuses_each_field_that_configures_an_engine(field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} does not apply to profile external"):
        ModelServerSpec.model_validate({**EXTERNAL, field: ENGINE_VALUES[field]})


def test_external_and_its_profile_come_together() -> None:
    with pytest.raises(ValidationError, match=r"external \(the server.s url\) is required"):
        ModelServerSpec.model_validate({"profile": "external", "model": "llama3.2:1b"})
    with pytest.raises(ValidationError, match="only applies to it"):
        ModelServerSpec.model_validate({"model": "a/b", "external": {"url": "http://10.88.0.1:11434"}})


def test_engine_profiles_still_take_only_hub_ids_and_paths() -> None:
    with pytest.raises(ValidationError, match="model must be a hub id"):
        ModelServerSpec.model_validate({"model": "llama3.2", "profile": "cpu"})
    assert ModelServerSpec.model_validate({"model": "/models/x.gguf", "profile": "cpu"})
