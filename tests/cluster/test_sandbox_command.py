"""The README's main command, `make dev`, runs `modelserve-sandbox`: prove it end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sandbox_brings_the_examples_up_and_explains_the_one_that_cannot_fit(tmp_path: Path) -> None:
    sandbox = Path(sys.executable).with_name("modelserve-sandbox")
    result = subprocess.run(
        [str(sandbox), "--exit-when-settled", "--settle-timeout", "240", "--workdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.split("NAMESPACE", 1)[1].split("\n\n", 1)[0]  # `kubectl get ms -A`, up to the pods
    rows = {line.split()[1]: line for line in table.splitlines()[1:] if line.startswith("default ")}
    examples = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
    assert len(rows) == len(examples) == 5
    too_big = [name for name in rows if "16gpu" in name]
    assert len(too_big) == 1
    for name, row in rows.items():
        if name in too_big:
            assert " False " in row and "InsufficientGPU" in row
        else:
            assert " True " in row and "Ready" in row
    assert "no node has 16 free nvidia.com/gpu" in result.stdout
    # The gateway runs beside the operator and knows the public example.
    assert "gateway: http://127.0.0.1:" in result.stdout
    assert "models the gateway lists without a key: gemma3-270m-cpu\n" in result.stdout
    # The cpu example ran for real on the real node; the GPU ones on KWOK's nodes.
    nodes = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith(("real-", "gpu-"))}
    assert "containerd://" in nodes["real-0"] and nodes["real-0"].split()[-1] == "real"
    pods = {
        line.split()[1].rsplit("-", 2)[0]: line
        for line in result.stdout.splitlines()
        if line.startswith("default ") and " Running " in line
    }
    assert " 2/2 " in pods["gemma3-270m-cpu"] and " real-0 " in pods["gemma3-270m-cpu"]
    assert " gpu-" in pods["lfm2-1-2b"]
    # Everything it started has stopped: no process still runs from its work dir.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    # ... and the host is as it was: no bridge, no kube-proxy or kubelet chains, no mounts.
    assert subprocess.run(["ip", "link", "show", "msbr0"], capture_output=True).returncode != 0
    assert "KUBE-" not in subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
