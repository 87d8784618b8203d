"""A group's command lines read by the engines' own parsers, in pods on the real node, with the
$(LWS_*) values the kubelet substitutes from what LeaderWorkerSet's webhook sets:

- vLLM's: `vllm serve` as the leader runs it, through the pinned vLLM's CLI entry point (its parser
  and its serve validation), from its wheel (hack/install-vllm-cli.sh) in the sandbox's vLLM image's
  Python; only the server start is replaced by printing what vLLM parsed;
- SGLang's, for the leader and a worker: the pinned SGLang's own `ServerArgs.add_cli_args` parser
  (what `prepare_server_args` runs before it looks for a GPU), from its wheel
  (hack/install-sglang-cli.sh) in the same image's Python, which has SGLang's heavy imports."""

from __future__ import annotations

from typing import Any

from harness.testdata import examples
from modelserve.api.manifests import workload
from modelserve.api.spec import ModelServer
from modelserve_sandbox.cluster import Cluster
from tests.helpers.engine_parsers import (
    SETTINGS,
    VLLM_IMAGE,
    parsed,
    sglang_container,
    sglang_volume,
    vllm_container,
    vllm_volume,
)

VLLM_KEYS = (
    "model_tag",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "host",
    "port",
    "load_format",
)
# SGLang 0.5.23's names (srt/arg_groups/fields/parallel.py: tp_size, with --tensor-parallel-size an alias).
SGLANG_KEYS = ("model_path", "tp_size", "pp_size", "nnodes", "node_rank", "dist_init_addr", "load_format")


def _group_env(worker_index: int) -> list[dict[str, str]]:
    """What LeaderWorkerSet's webhook gives a pod of group 0 of `m` in `ns`, for the kubelet's $(VAR) expansion."""
    env = {"LWS_LEADER_ADDRESS": "m-0.m-0.ns", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(worker_index)}
    return [{"name": name, "value": value} for name, value in env.items()]


def _engines(manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's and a worker's engine containers."""
    group = workload(ModelServer.from_manifest(manifest), SETTINGS)["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"]["spec"]["containers"][0], group["workerTemplate"]["spec"]["containers"][0]


def test_vllm_reads_the_leaders_command_line(node_cluster: Cluster) -> None:
    # spec.loadFormat as the pinned parser reads it (engines' load_formats; refused at apply otherwise).
    manifest = examples()["lfm2-24b-a2b-16gpu"]
    leader, _ = _engines({**manifest, "spec": {**manifest["spec"], "loadFormat": "runai_streamer"}})
    assert leader["command"][:2] == ["/bin/sh", "-c"] and leader["command"][-1] == "vllm-leader"
    assert leader["image"] == VLLM_IMAGE
    # The image's Python runs vLLM's CLI on exactly the arguments `vllm serve "$@"` gets.
    container = vllm_container(leader["args"], VLLM_KEYS, _group_env(0))
    assert parsed(node_cluster, "vllm-leader", container, vllm_volume()) == {
        "model_tag": "LiquidAI/LFM2-24B-A2B",
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
        "host": "127.0.0.1",
        "port": 8000,
        "load_format": "runai_streamer",
    }


def test_sglang_reads_the_leaders_and_a_workers_command_lines(node_cluster: Cluster) -> None:
    volume = sglang_volume()
    manifest = examples()["lfm2-8b-a1b"]
    manifest = {**manifest, "spec": {**manifest["spec"], "gpus": 16, "nodes": 2, "loadFormat": "fastsafetensors"}}
    for index, engine in enumerate(_engines(manifest)):
        assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
        container = sglang_container(engine["args"], SGLANG_KEYS, _group_env(index))
        assert parsed(node_cluster, f"sglang-{index}", container, volume) == {
            "model_path": "LiquidAI/LFM2-8B-A1B",
            "tp_size": 8,
            "pp_size": 2,
            "nnodes": 2,
            "node_rank": index,
            "dist_init_addr": "m-0.m-0.ns:20000",
            "load_format": "fastsafetensors",
        }
