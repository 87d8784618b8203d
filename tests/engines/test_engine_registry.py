"""An engine is one module: its facts are on its `Engine`, and the spec's rules follow from the
registry. A made-up engine added to a registry gets its rules without a line of api/ changed."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from harness.testdata import examples
from modelserve.api import engine_rules, validation
from modelserve.api.spec import ModelServer
from modelserve.contracts import engine_routes
from modelserve.contracts.adapters import AdapterApi
from modelserve.contracts.choices import Dtype
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import ENGINES, REGISTRY, llamacpp, vllm
from modelserve.engines.base import Engine, Role
from tests.helpers.chart import REPO

OWN_FIELDS = {wire for wire, _, _ in engine_rules.ENGINE_OWN_FIELDS}


@pytest.mark.parametrize("profile", sorted(ENGINES))
def test_each_engines_facts_agree(profile: str) -> None:
    engine = ENGINES[profile]
    assert set(engine.own_fields) <= OWN_FIELDS, "a field only this engine reads needs its test in engine_rules"
    if engine.spans_nodes:
        assert engine.on_gpus and engine.group_flags, "a group splits GPUs, sized by flags engineArgs may not set"
        assert type(engine).launch is not Engine.launch, "an engine spanning nodes wires its leader and workers"
    # Each capability it lacks says why, for the refusal's message.
    if set(engine.dtypes) != set(Dtype):
        assert engine.why_not("dtype")
    if not engine.tool_call_parsers:
        assert engine.why_not("toolCallParser")
    if engine.adapter_api == AdapterApi.NONE:
        assert engine.why_not("adapters")


def test_each_engine_has_its_own_route_table_and_every_table_an_engine() -> None:
    assert [engine.routes for engine in REGISTRY] == list(engine_routes.TABLES)
    assert all(engine.routes.engine == engine.name for engine in REGISTRY)


@pytest.mark.parametrize("engine", REGISTRY, ids=[engine.name for engine in REGISTRY])
def test_an_engines_refused_routes_are_in_its_own_table(engine: Engine) -> None:
    """Its table of routes read from its source (the fixture) against its Engine's: each alias and
    administration route is in the class the fixture gives it (the proxies merge every engine's)."""
    fixture = REPO / "tests" / "fixtures" / "engine_routes" / f"{engine.title.lower()}-{engine.version}.json"
    table = engine.routes
    wrong = []
    for route in json.loads(fixture.read_text())["routes"]:
        path, kind = route["path"], route["class"]
        if kind == "engine_alias":
            ok = path in table.aliases or path.startswith(table.alias_prefixes)
        elif kind == "engine_admin":
            ok = path in table.admin or path.startswith(table.admin_prefixes)
        else:
            continue
        if not ok:
            wrong.append(f"{route['method']} {path} ({route['source']}): not in {engine.name}'s {kind} routes")
    assert not wrong, "\n".join(wrong)


def test_each_engine_names_its_image_setting() -> None:
    # The chart turns engines.<name>.image into MODELSERVE_ENGINE_IMAGE_<NAME> (`upper`); the
    # operator reads the name back in lower case.
    for engine in REGISTRY:
        assert re.fullmatch(r"[a-z][a-z0-9]*", engine.name), engine.name
        assert engine.image_env == f"MODELSERVE_ENGINE_IMAGE_{engine.name.upper()}"
        assert (
            Settings.from_env({engine.image_env: "mirror/x:1"}).engine_image(engine.name, engine.image) == "mirror/x:1"
        )


def test_every_engine_only_field_has_an_engine() -> None:
    owned = {field for engine in ENGINES.values() for field in engine.own_fields}
    assert owned == OWN_FIELDS


def test_a_refusal_without_its_reason_names_the_engine_and_the_field() -> None:
    with pytest.raises(ValueError, match="engine vllm refuses dtype"):
        vllm.ENGINE.why_not("dtype")


def test_rule_messages_are_unique() -> None:
    # validation.rules_by_message finds the rule of a refusal by its message.
    rules = [rule for cls_rules in _all_rules() for rule in cls_rules]
    assert len({rule.message for rule in rules}) == len(rules)
    assert len(validation.rules_by_message()) == len(rules)


def _all_rules() -> list[tuple[Any, ...]]:
    from modelserve.api import spec

    found, pending = [], [spec.WireModel]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        found.append(cls.rules)
    return found


# --- a made-up engine, added to a registry the rule builders are given --------------------------

FAST = dataclasses.replace(
    vllm.ENGINE,
    name="fast",
    title="Fast",
    own_fields=("torchCompile",),
    adapter_api=AdapterApi.NONE,
    refusals=(("adapters", "Fast loads no adapters"),),
)
SLOW_CPU = dataclasses.replace(
    llamacpp.ENGINE,
    name="slowcpu",
    title="SlowCPU",
    dtypes=(Dtype.AUTO, Dtype.FLOAT32),
    refusals=(
        ("dtype", "SlowCPU computes in float32"),
        ("toolCallParser", "SlowCPU reads tool calls from the template"),
        ("adapters", "SlowCPU takes none"),
    ),
)
EXTENDED = {**ENGINES, "fast": FAST, "slow-cpu": SLOW_CPU}


def _rule(rules: tuple[Any, ...], field: str, containing: str = "") -> Any:
    (rule,) = [rule for rule in rules if rule.field == field and containing in rule.message]
    return rule


def _spec(**fields: Any) -> Any:
    """A stand-in for a spec, with the attributes the rules read."""
    base = {
        "profile": "fast",
        "gpus": None,
        "nodes": None,
        "node_count": 1,
        "dtype": Dtype.AUTO,
        "adapters": None,
        "torch_compile": False,
        "chunked_prefill_size": None,
        "gpu_memory_utilization": None,
        "tool_call_parser": None,
        "model": "a/b",
    }
    return type("Spec", (), {**base, **fields})()


def test_a_new_gpu_engine_joins_the_gpu_and_node_rules() -> None:
    rules = engine_rules.gpu_rules(EXTENDED)
    at_least_one = _rule(rules, "gpus", "at least 1")
    assert "'fast'" in at_least_one.cel and at_least_one.message.endswith(" and fast")
    assert not at_least_one.holds(_spec(gpus=0)) and at_least_one.holds(_spec(gpus=2))
    zero = _rule(rules, "gpus", "0 or unset")
    assert "'slow-cpu']" in zero.cel and zero.message.endswith(" and slow-cpu")
    nodes = _rule(rules, "nodes")
    assert nodes.holds(_spec(node_count=2)) and not nodes.holds(_spec(profile="slow-cpu", node_count=2))
    assert "slow-cpu and external run one pod per replica" in nodes.message


def test_a_gpu_engine_that_spans_no_nodes_is_left_out_of_the_nodes_rule() -> None:
    single = dataclasses.replace(FAST, spans_nodes=False)
    (nodes,) = [rule for rule in engine_rules.gpu_rules({**ENGINES, "fast": single}) if rule.field == "nodes"]
    assert "'fast'" not in nodes.cel and not nodes.holds(_spec(node_count=2))
    assert "fast and external run one pod per replica" in nodes.message


def test_a_new_engine_takes_the_fields_it_lists_and_refuses_the_rest() -> None:
    rules = engine_rules.own_field_rules(EXTENDED)
    torch = _rule(rules, "torchCompile")
    assert torch.cel == "!self.torchCompile || self.profile in ['low-latency', 'fast']"
    assert torch.holds(_spec(torch_compile=True))
    chunked = _rule(rules, "chunkedPrefillSize")
    assert not chunked.holds(_spec(chunked_prefill_size=512))


def test_a_new_engines_dtypes_adapters_and_parsers() -> None:
    (cpu_dtype, slow_dtype) = engine_rules.dtype_rules(EXTENDED)
    assert slow_dtype.cel == "self.profile != 'slow-cpu' || self.dtype in ['auto', 'float32']"
    assert slow_dtype.message == "dtype must be auto or float32 for profile slow-cpu: SlowCPU computes in float32"
    assert slow_dtype.holds(_spec(profile="slow-cpu", dtype=Dtype.FLOAT32))
    assert not slow_dtype.holds(_spec(profile="slow-cpu", dtype=Dtype.FLOAT16))
    assert "'cpu'" in cpu_dtype.cel

    (adapters,) = engine_rules.adapter_rules(EXTENDED)
    assert "'fast'" not in adapters.cel and not adapters.holds(_spec(adapters=[]))
    assert adapters.message.endswith("Fast loads no adapters, SlowCPU takes none, and an external server loads its own")

    parsers = engine_rules.tool_call_parser_rules(EXTENDED)
    no_parser = _rule(parsers, "toolCallParser", "SlowCPU reads")
    assert not no_parser.holds(_spec(profile="slow-cpu", tool_call_parser="hermes"))
    knows = _rule(parsers, "toolCallParser", "Fast")
    assert knows.holds(_spec(tool_call_parser="hermes")) and not knows.holds(_spec(tool_call_parser="nope"))


def test_a_new_engines_flags_are_refused_under_its_own_profile() -> None:
    (owned,) = [r for r in engine_rules.owned_flag_rules(EXTENDED) if "profile fast" in r.message]
    assert owned.cel.startswith("self.profile != 'fast'")
    assert not owned.holds(_spec(engine_args=["--port=1"])) and owned.holds(_spec(engine_args=["--seed=1"]))


def test_the_real_registry_refuses_what_it_did() -> None:
    base = examples()["smollm2-135m-cpu"]
    for change, complaint in [
        ({"gpus": 1}, "gpus must be 0 or unset for profile cpu"),
        ({"dtype": "float16"}, "dtype must be auto for profile cpu: llama.cpp uses the GGUF's own types"),
        ({"torchCompile": True}, "torchCompile only applies to profile low-latency"),
        ({"nodes": 2}, "nodes above 1 needs a GPU profile (high-throughput or low-latency"),
    ]:
        with pytest.raises(ValueError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
            ModelServer.from_manifest({**base, "spec": {**base["spec"], **change}})


def test_a_spanning_engine_launches_leader_and_workers() -> None:
    ms = ModelServer.from_manifest(examples()["lfm2-24b-a2b-16gpu"])
    engine = ENGINES[ms.spec.profile]
    assert engine.spans_nodes
    command, args = engine.launch(ms, Role.WORKER)
    assert command[:2] == ["/bin/sh", "-c"] and "exec ray start" in command[2] and args == []


def test_a_flag_the_pinned_release_removed_passes_with_an_image_of_an_older_release() -> None:
    # b11434 folded --no-mmap into --load-mode: refused with the pinned image, an older image takes it.
    base = examples()["smollm2-135m-cpu"]
    removed = {**base["spec"], "engineArgs": ["--no-mmap"]}
    with pytest.raises(ValueError, match=r"llama\.cpp b11434 no longer has them"):
        ModelServer.from_manifest({**base, "spec": removed})
    older = {**removed, "image": f"ghcr.io/ggml-org/llama.cpp:server-{llamacpp.ENGINE.previous_version}"}
    assert ModelServer.from_manifest({**base, "spec": older}).spec.engine_args == ["--no-mmap"]
