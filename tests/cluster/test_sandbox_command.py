"""The README's main command, `make dev`, runs `modelserve-sandbox`: prove it end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sandbox_brings_the_examples_up_and_explains_the_one_that_cannot_fit(tmp_path: Path) -> None:
    sandbox = Path(sys.executable).with_name("modelserve-sandbox")
    result = subprocess.run(
        [str(sandbox), "--exit-when-settled", "--settle-timeout", "120", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.split("NAMESPACE", 1)[1]
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
    # Everything it started has stopped: no process still runs from its work dir.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
