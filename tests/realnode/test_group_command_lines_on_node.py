"""A group's vLLM command line read by vLLM's own command line, in the vllm/vllm-openai:v0.32.0
stand-in image on the real node: `vllm serve` as the leader runs it (with the $(LWS_*) values the
kubelet substitutes), through vLLM's CLI entry point (its parser and its serve validation); only the
server start is replaced by printing what vLLM parsed. SGLang has no image here, so its group lines
are checked against its flags by the unit tests only."""

from __future__ import annotations

import json
import uuid
from typing import Any

from modelserve.api.manifests import workload
from modelserve.api.spec import ModelServer
from modelserve.contracts.operator_settings import Settings
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import Cluster
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
# What LeaderWorkerSet's webhook gives a group's leader, for the kubelet's $(VAR) expansion.
GROUP_ENV = {"LWS_LEADER_ADDRESS": "m-0.m-0.ns", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}


def _leader_engine(manifest: dict[str, Any]) -> dict[str, Any]:
    made = workload(ModelServer.from_manifest(manifest), SETTINGS)
    return made["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]


def test_vllm_reads_the_leaders_command_line(node_cluster: Cluster) -> None:
    engine = _leader_engine(examples()["lfm2-24b-a2b-16gpu"])
    assert engine["command"][:2] == ["/bin/sh", "-c"] and engine["command"][-1] == "vllm-leader"
    namespace = f"p-{uuid.uuid4().hex[:6]}"
    node_cluster.create_namespace(namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "parse", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": realnode.NODE_NAME},
            "containers": [
                {
                    "name": "engine",
                    "image": engine["image"],
                    "imagePullPolicy": "Never",
                    # The image's Python runs vLLM's CLI on exactly the arguments `vllm serve "$@"` gets.
                    "command": ["python3", "-c", PARSE],
                    "args": engine["args"],
                    "env": [{"name": k, "value": v} for k, v in GROUP_ENV.items()],
                }
            ],
        },
    }
    try:
        node_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

        def finished() -> bool:
            out = node_cluster.kubectl("get", "pod", "parse", "-n", namespace, "-o", "json").stdout
            return json.loads(out).get("status", {}).get("phase") in ("Succeeded", "Failed")

        wait_until(finished, 300, "vLLM's CLI to parse the leader's arguments", interval=1.0)
        logs = node_cluster.kubectl("logs", "parse", "-n", namespace).stdout
        parsed_lines = [line for line in logs.splitlines() if line.startswith("PARSED ")]
        assert len(parsed_lines) == 1, logs[-3000:]
        parsed = json.loads(parsed_lines[0].removeprefix("PARSED "))
        assert parsed == {
            "model_tag": "LiquidAI/LFM2-24B-A2B",
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
            "host": "127.0.0.1",
            "port": 8000,
        }
    finally:
        node_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
