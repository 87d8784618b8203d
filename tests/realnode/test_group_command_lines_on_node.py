"""A group's command lines read by the engines' own parsers, in pods on the real node, with the
$(LWS_*) values the kubelet substitutes from what LeaderWorkerSet's webhook sets:

- vLLM's: `vllm serve` as the leader runs it, through vLLM's CLI entry point (its parser and its
  serve validation) in the vllm/vllm-openai:v0.32.0 stand-in image; only the server start is
  replaced by printing what vLLM parsed;
- SGLang's, for the leader and a worker: SGLang 0.5.10's own `ServerArgs.add_cli_args` parser
  (what `prepare_server_args` runs before it looks for a GPU), from its wheel
  (hack/install-sglang-cli.sh) in the same image's Python, which has SGLang's heavy imports."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from modelserve.api.manifests import workload
from modelserve.api.spec import ModelServer
from modelserve.contracts.operator_settings import Settings
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import Cluster, default_cache
from modelserve_sandbox.processes import wait_until
from tests.helpers.operator_testdata import examples

SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
# vLLM's real `vllm` entry point with `serve`, whose server start alone prints the parsed arguments.
PARSE = """
import json, sys
from vllm.entrypoints.cli import serve

def show(args):
    keys = ("model_tag", "tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend")
    keys += ("host", "port")
    print("PARSED " + json.dumps({key: getattr(args, key) for key in keys}))

serve.ServeSubcommand.cmd = staticmethod(show)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "serve", *sys.argv[1:]]
main()
"""
# SGLang's parser, as prepare_server_args builds it; what it read, by its own names.
SGLANG_PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
raw = parser.parse_args(sys.argv[1:])
keys = ("model_path", "tensor_parallel_size", "pipeline_parallel_size", "nnodes", "node_rank", "dist_init_addr")
print("PARSED " + json.dumps({key: getattr(raw, key) for key in keys}))
"""
SGLANG_SITE = "/opt/sglang-cli"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


def _group_env(worker_index: int) -> list[dict[str, str]]:
    """What LeaderWorkerSet's webhook gives a pod of group 0 of `m` in `ns`, for the kubelet's $(VAR) expansion."""
    env = {"LWS_LEADER_ADDRESS": "m-0.m-0.ns", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(worker_index)}
    return [{"name": name, "value": value} for name, value in env.items()]


def _engines(manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's and a worker's engine containers."""
    group = workload(ModelServer.from_manifest(manifest), SETTINGS)["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"]["spec"]["containers"][0], group["workerTemplate"]["spec"]["containers"][0]


def _parsed(cluster: Cluster, name: str, container: dict[str, Any], volume: dict[str, Any] | None = None) -> Any:
    """Run one container to completion on the real node; what its PARSED line says."""
    namespace = f"p-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    container = {"name": "engine", "image": VLLM_IMAGE, "imagePullPolicy": "Never", **container}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": realnode.NODE_NAME},
        "containers": [container],
    }
    if volume:
        spec["volumes"] = [volume]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

        def finished() -> bool:
            out = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
            return json.loads(out).get("status", {}).get("phase") in ("Succeeded", "Failed")

        wait_until(finished, 300, f"pod {name} to parse its arguments", interval=1.0)
        logs = cluster.kubectl("logs", name, "-n", namespace).stdout
        parsed_lines = [line for line in logs.splitlines() if line.startswith("PARSED ")]
        assert len(parsed_lines) == 1, logs[-3000:]
        return json.loads(parsed_lines[0].removeprefix("PARSED "))
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_vllm_reads_the_leaders_command_line(node_cluster: Cluster) -> None:
    leader, _ = _engines(examples()["lfm2-24b-a2b-16gpu"])
    assert leader["command"][:2] == ["/bin/sh", "-c"] and leader["command"][-1] == "vllm-leader"
    assert leader["image"] == VLLM_IMAGE
    # The image's Python runs vLLM's CLI on exactly the arguments `vllm serve "$@"` gets.
    container = {"command": ["python3", "-c", PARSE], "args": leader["args"], "env": _group_env(0)}
    assert _parsed(node_cluster, "vllm-leader", container) == {
        "model_tag": "LiquidAI/LFM2-24B-A2B",
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
        "host": "127.0.0.1",
        "port": 8000,
    }


def test_sglang_reads_the_leaders_and_a_workers_command_lines(node_cluster: Cluster) -> None:
    site = default_cache() / "sglang-cli" / "site"
    assert (site / "sglang" / "srt" / "server_args.py").is_file(), "run `bash hack/install-sglang-cli.sh`"
    manifest = examples()["lfm2-8b-a1b"]
    manifest = {**manifest, "spec": {**manifest["spec"], "gpus": 16, "nodes": 2}}
    volume = {"name": "sglang", "hostPath": {"path": str(Path(site)), "type": "Directory"}}
    for index, engine in enumerate(_engines(manifest)):
        assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
        container = {
            "command": ["python3", "-c", SGLANG_PARSE],
            "args": engine["args"],
            "env": [*_group_env(index), {"name": "PYTHONPATH", "value": SGLANG_SITE}],
            "volumeMounts": [{"name": "sglang", "mountPath": SGLANG_SITE, "readOnly": True}],
        }
        assert _parsed(node_cluster, f"sglang-{index}", container, volume) == {
            "model_path": "LiquidAI/LFM2-8B-A1B",
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "nnodes": 2,
            "node_rank": index,
            "dist_init_addr": "m-0.m-0.ns:20000",
        }
