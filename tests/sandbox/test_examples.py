"""Which examples `make dev` applies: beside a real node, those whose model the sandbox's hub
serves (they run for real); with KWOK alone, all of them."""

from __future__ import annotations

from pathlib import Path

from modelserve_sandbox.cluster import hub_files
from modelserve_sandbox.main import examples_to_apply

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_beside_a_real_node_the_examples_that_run_here(tmp_path: Path) -> None:
    repos = {f.repo for f in hub_files(tmp_path)}
    chosen, left_out = examples_to_apply(EXAMPLES, repos)
    assert [p.name for p in chosen] == ["smollm2-135m-cpu.yaml", "tiny-chatml-vllm.yaml"]
    assert left_out[EXAMPLES / "lfm2-1.2b.yaml"] == "LiquidAI/LFM2-1.2B is not on the sandbox's hub"
    assert set(chosen) | set(left_out) == {p for p in EXAMPLES.iterdir() if p.suffix == ".yaml"}


def test_kwok_alone_takes_every_example() -> None:
    chosen, left_out = examples_to_apply(EXAMPLES, None)
    assert not left_out and len(chosen) == len([p for p in EXAMPLES.iterdir() if p.suffix == ".yaml"])
