"""The README's main command, `make dev`, runs `modelserve-sandbox`: prove it end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sandbox_serves_what_the_real_node_can_and_says_what_it_leaves_out(tmp_path: Path) -> None:
    sandbox = Path(sys.executable).with_name("modelserve-sandbox")
    result = subprocess.run(
        # Start-up imports the node's images (vLLM's is 6.0 GB) before the examples are applied.
        [str(sandbox), "--exit-when-settled", "--settle-timeout", "400", "--workdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=720,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.split("NAMESPACE", 1)[1].split("\n\n", 1)[0]  # `kubectl get ms -A`, up to the pods
    rows = {line.split()[1]: line for line in table.splitlines()[1:] if line.startswith("default ")}
    # Beside the real node, the examples whose model the sandbox's hub serves run for real: the cpu
    # one (llama.cpp) and the high-throughput one (vLLM's CPU build); the one whose replica spans two
    # nodes goes to KWOK's GPU nodes; the rest need a GPU cluster.
    served = {"smollm2-135m-cpu", "smollm2-135m-vllm"}
    multi_node = "lfm2-24b-a2b-16gpu"
    assert set(rows) == {*served, multi_node}, result.stdout
    for row in rows.values():
        assert " True " in row and "Ready" in row
    assert f"applied on KWOK's GPU nodes: examples/{multi_node}.yaml (" in result.stdout
    left_out = sorted(p.name for p in (REPO / "examples").glob("*.yaml") if p.stem not in {*served, multi_node})
    assert len(left_out) == 3
    for name in left_out:
        assert f"not applied beside the real node: examples/{name} (" in result.stdout
    # The gateway runs beside the operator and knows the public example.
    assert "gateway: http://127.0.0.1:" in result.stdout
    assert "models the gateway lists without a key: smollm2-135m-cpu\n" in result.stdout
    # Both ran for real on the real node.
    nodes = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith(("real-", "gpu-"))}
    assert "containerd://" in nodes["real-0"] and nodes["real-0"].split()[-1] == "real"
    pods = {
        line.split()[1].rsplit("-", 2)[0]: line
        for line in result.stdout.splitlines()
        if line.startswith("default ") and " Running " in line
    }
    for name in served:
        assert " 2/2 " in pods[name] and " real-0 " in pods[name]
    # The group's leader (engine and sidecar) and worker (engine), one on each KWOK GPU node.
    group = {line.split()[1]: line for line in result.stdout.splitlines() if f" {multi_node}-0" in line}
    assert " 2/2 " in group[f"{multi_node}-0"] and " 1/1 " in group[f"{multi_node}-0-1"], result.stdout
    assert {line.split()[7] for line in group.values()} == {"gpu-0", "gpu-1"}, result.stdout
    # Everything it started has stopped: no process still runs from its work dir.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    # ... and the host is as it was: no bridge, no kube-proxy or kubelet chains, no mounts.
    assert subprocess.run(["ip", "link", "show", "msbr0"], capture_output=True).returncode != 0
    assert "KUBE-" not in subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
