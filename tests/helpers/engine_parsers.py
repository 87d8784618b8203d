"""The engines' own command-line parsers, at the versions the operator pins, run in a pod on the real
node on the arguments we generate: vLLM's `vllm serve` entry point (its parser and serve validation;
only the server start is replaced by printing what it parsed) and SGLang's `ServerArgs.add_cli_args`
parser, each from its wheel unpacked into the cache (hack/install-vllm-cli.sh,
hack/install-sglang-cli.sh) and run in the Python of the sandbox's vLLM image (vLLM's CPU build, which
has torch, transformers and the rest of their imports; realnode.VLLM_IMAGE)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from modelserve.contracts.operator_settings import Settings
from modelserve.engines import sglang, vllm
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import Cluster, default_cache
from modelserve_sandbox.processes import wait_until

SGLANG_SITE = "/opt/sglang-cli"
VLLM_SITE = "/opt/vllm-cli"
# What the operator generates pods with here: the node's vLLM image, as the sandbox's operators do.
SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0", engine_images={"vllm": realnode.VLLM_IMAGE})
VLLM_IMAGE = realnode.VLLM_IMAGE

_VLLM = """
import json, sys
from vllm.entrypoints.cli import serve

def show(args):
    print("PARSED " + json.dumps({{key: getattr(args, key) for key in {keys!r}}}))

serve.ServeSubcommand.cmd = staticmethod(show)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "serve", *sys.argv[1:]]
main()
"""
_SGLANG = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
raw = parser.parse_args(sys.argv[1:])
{checks}
out = {{key: getattr(raw, key) for key in {keys!r}}}
print("PARSED " + json.dumps(out, default=sorted))
"""


def vllm_container(args: list[str], keys: tuple[str, ...], env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A container that runs the pinned vLLM's CLI (ahead of the image's own vLLM on PYTHONPATH) on
    `args` and prints the parsed values of `keys`. VLLM_TARGET_DEVICE=cpu: the unpacked CUDA release
    would otherwise look for a GPU platform (vllm/platforms), as the image's CPU build does not."""
    pinned = [{"name": "PYTHONPATH", "value": VLLM_SITE}, {"name": "VLLM_TARGET_DEVICE", "value": "cpu"}]
    return {
        "command": ["python3", "-c", _VLLM.format(keys=keys)],
        "args": args,
        "env": [*(env or []), *pinned],
        "volumeMounts": [{"name": "vllm", "mountPath": VLLM_SITE, "readOnly": True}],
    }


def sglang_container(
    args: list[str], keys: tuple[str, ...], env: list[dict[str, str]] | None = None, lora_checks: bool = False
) -> dict[str, Any]:
    """A container that runs SGLang's parser on `args` (then, with `lora_checks`, its own LoRA checks,
    check_lora_server_args of srt/arg_groups/lora_hook.py since 0.5.23, which need no GPU) and prints
    the parsed values of `keys`."""
    checks = "from sglang.srt.arg_groups.lora_hook import check_lora_server_args\ncheck_lora_server_args(raw)"
    checks = checks if lora_checks else ""
    return {
        "command": ["python3", "-c", _SGLANG.format(keys=keys, checks=checks)],
        "args": args,
        "env": [*(env or []), {"name": "PYTHONPATH", "value": SGLANG_SITE}],
        "volumeMounts": [{"name": "sglang", "mountPath": SGLANG_SITE, "readOnly": True}],
    }


def sglang_volume() -> dict[str, Any]:
    site = default_cache() / "sglang-cli" / sglang.VERSION / "site"
    assert (site / "sglang" / "srt" / "server_args.py").is_file(), "run `bash hack/install-sglang-cli.sh`"
    return {"name": "sglang", "hostPath": {"path": str(site), "type": "Directory"}}


def vllm_volume() -> dict[str, Any]:
    site = default_cache() / "vllm-cli" / vllm.VERSION / "site"
    assert (site / "vllm" / "entrypoints" / "cli" / "main.py").is_file(), "run `bash hack/install-vllm-cli.sh`"
    return {"name": "vllm", "hostPath": {"path": str(site), "type": "Directory"}}


def parsed(cluster: Cluster, name: str, container: dict[str, Any], volume: dict[str, Any] | None = None) -> Any:
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
