"""Which examples `make dev` applies: beside a real node, those whose model the sandbox's hub
serves (they run for real); with KWOK alone, all of them."""

from __future__ import annotations

from pathlib import Path

import yaml

from modelserve_sandbox.cluster import hub_files
from modelserve_sandbox.main import KWOK_TOLERATION, examples_to_apply, on_kwok

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_beside_a_real_node_the_examples_that_run_here(tmp_path: Path) -> None:
    repos = {f.repo for f in hub_files(tmp_path)}
    examples = examples_to_apply(EXAMPLES, repos)
    assert [p.name for p in examples.chosen] == ["smollm2-135m-cpu.yaml", "smollm2-135m-vllm.yaml"]
    assert examples.left_out[EXAMPLES / "lfm2-1.2b.yaml"] == "LiquidAI/LFM2-1.2B is not on the sandbox's hub"
    # A replica spanning two nodes cannot run on the one real node: KWOK's GPU nodes play the cluster.
    assert [p.name for p in examples.on_kwok] == ["lfm2-24b-a2b-16gpu.yaml"]
    every = {p for p in EXAMPLES.iterdir() if p.suffix == ".yaml"}
    assert set(examples.chosen) | set(examples.on_kwok) | set(examples.left_out) == every


def test_kwok_alone_takes_every_example() -> None:
    examples = examples_to_apply(EXAMPLES, None)
    assert not examples.left_out and not examples.on_kwok
    assert len(examples.chosen) == len([p for p in EXAMPLES.iterdir() if p.suffix == ".yaml"])


def test_an_example_for_kwok_tolerates_its_taint_and_selects_its_nodes_and_keeps_the_rest() -> None:
    (manifest,) = on_kwok(EXAMPLES / "lfm2-24b-a2b-16gpu.yaml")
    original = yaml.safe_load((EXAMPLES / "lfm2-24b-a2b-16gpu.yaml").read_text())
    assert manifest["spec"].pop("tolerations") == [KWOK_TOLERATION]
    assert manifest["spec"].pop("nodeSelector") == {"type": "kwok"}
    assert manifest == original
