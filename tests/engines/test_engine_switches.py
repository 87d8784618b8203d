"""Each engine's table of what opens its administration routes: every flag refused in every spelling
its parser reads, every variable with every profile, ordinary flags and variables still accepted,
and llama.cpp's names checked against the real llama-server."""

from __future__ import annotations

import re
from typing import Any

import pytest

from harness.testdata import examples, invalid_cases
from modelserve.api.spec import ModelServer, Profile
from modelserve.engines import ENGINES
from modelserve.engines.base import Engine
from modelserve_sandbox.llama_server import llama_server_help

# Each engine profile's first single-node example (a new engine's example serves here too).
BASE = {
    profile: min(
        name
        for name, manifest in examples().items()
        if manifest["spec"].get("profile", Profile.HIGH_THROUGHPUT) == profile and manifest["spec"].get("nodes", 1) == 1
    )
    for profile in ENGINES
}


def _manifest(profile: Profile, **spec: Any) -> dict[str, Any]:
    manifest = examples()[BASE[profile]]
    return {**manifest, "spec": {**manifest["spec"], **spec}}


def _spellings(engine: Engine, flag: str) -> list[list[str]]:
    """engineArgs setting `flag` in each way the engine's parser reads it."""
    out = [[flag], [flag, "x"], [f"{flag}=x"]]
    if engine.underscored_flags:
        out.append([flag.replace("-", "_").replace("__", "--", 1)])
    if engine.abbreviated_flags:
        out.append([flag[:-1]])
    return out


FLAG_CASES = [
    (profile, switch.name, args)
    for profile, engine in ENGINES.items()
    for switch in engine.admin_flags
    for args in _spellings(engine, switch.name)
]


@pytest.mark.parametrize(("profile", "flag", "args"), FLAG_CASES, ids=[f"{p}-{' '.join(a)}" for p, _, a in FLAG_CASES])
def test_every_admin_flag_is_refused_in_every_spelling(profile: Profile, flag: str, args: list[str]) -> None:
    with pytest.raises(ValueError, match="engineArgs must not set these") as refused:
        ModelServer.from_manifest(_manifest(profile, engineArgs=["--max-num-seqs", "8", *args]))
    assert flag in str(refused.value) and f"profile {profile}" in str(refused.value)


ENV_CASES = [
    (profile, switch.name) for engine in ENGINES.values() for switch in engine.admin_env for profile in ENGINES
]


@pytest.mark.parametrize(("profile", "name"), ENV_CASES, ids=[f"{p}-{n}" for p, n in ENV_CASES])
def test_every_admin_variable_is_refused_with_every_profile(profile: Profile, name: str) -> None:
    with pytest.raises(ValueError, match=f"env must not name these .*{name} \\("):
        ModelServer.from_manifest(_manifest(profile, env=[{"name": name, "value": "0"}]))


# Flags and variables people use, some sharing a prefix with a refused one: still accepted.
ORDINARY = {
    Profile.HIGH_THROUGHPUT: (
        ["--max-num-seqs", "64", "--enable-prefix-caching", "--enable-lora-bias", "--api-server-count=2"],
        ["VLLM_LOGGING_LEVEL", "VLLM_SERVER_DEV_MODE_NOTE"],
    ),
    Profile.LOW_LATENCY: (
        ["--max-running-requests", "32", "--enable-lora-overlap-loading", "--log-level=info"],
        ["SGLANG_LOG_LEVEL"],
    ),
    Profile.CPU: (
        ["--no-slots", "--no-webui", "--lora", "/root/.cache/huggingface/a.gguf", "--threads=2"],
        ["LLAMA_ARG_THREADS", "LLAMA_ARG_N_PARALLEL"],
    ),
}


@pytest.mark.parametrize("profile", sorted(ORDINARY))
def test_ordinary_flags_and_variables_pass(profile: Profile) -> None:
    args, names = ORDINARY[profile]
    env = [{"name": name, "value": "1"} for name in names]
    assert ModelServer.from_manifest(_manifest(profile, engineArgs=args, env=env)).spec.engine_args == args


def test_the_catalog_refuses_each_switch_against_the_api_server() -> None:
    # tests/api/test_validation_cluster.py applies the catalog: each name appears there.
    said = " ".join(" ".join(case[3]) for case in invalid_cases())
    for engine in ENGINES.values():
        for switch in (*engine.admin_flags, *engine.admin_env):
            assert switch.name in said, switch.name


@pytest.mark.parametrize("profile", sorted(ENGINES))
def test_switch_tables_are_well_formed(profile: Profile) -> None:
    engine = ENGINES[profile]
    assert engine.admin_flags and all(re.fullmatch(r"--?[a-z][-a-z]*", s.name) for s in engine.admin_flags)
    assert engine.admin_env and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", s.name) for s in engine.admin_env)
    owned = set(engine.owned_flags)
    assert not owned & {s.name for s in engine.admin_flags}  # one rule per flag


def test_the_real_llama_server_has_every_refused_flag_and_argument_variable() -> None:
    help_text = llama_server_help()
    engine = ENGINES[Profile.CPU]
    for switch in engine.admin_flags:  # a name an older build read (`before`) is refused for older images
        if switch.before:
            continue
        assert re.search(rf"(^|[ ,]){re.escape(switch.name)}([ ,=]|$)", help_text, re.M), switch.name
    # LLAMA_ARG_* variables are the flags' own (the help names them); the others are read by the server.
    for switch in engine.admin_env:
        if switch.name.startswith("LLAMA_ARG_") and not switch.before:
            assert f"(env: {switch.name})" in help_text, switch.name
