"""One llama.cpp build everywhere: the engine the operator pins is the one the sandbox builds and runs."""

from __future__ import annotations

import re

from chart import REPO

from modelserve_operator.engines import llamacpp, sglang, vllm
from modelserve_sandbox import llama_server

README = (REPO / "README.md").read_text()


def _script_default(script: str) -> int:
    text = (REPO / "hack" / script).read_text()
    match = re.search(r"^LLAMA_BUILD=\$\{LLAMA_BUILD:-(\d+)\}$", text, re.M)
    assert match, f"hack/{script} sets no LLAMA_BUILD default"
    return int(match.group(1))


def test_the_llama_cpp_build_is_one_number() -> None:
    tag = llamacpp.FACTS.image.rsplit(":", 1)[1]
    assert tag == f"server-b{llama_server.LLAMA_BUILD}"
    assert _script_default("build-llama-server.sh") == llama_server.LLAMA_BUILD
    assert _script_default("build-images.sh") == llama_server.LLAMA_BUILD
    values = (REPO / "charts" / "modelserve" / "values.yaml").read_text()
    assert f"pinned: {llamacpp.FACTS.image}" in values


def test_the_readme_names_each_pinned_image() -> None:
    engines = README.split("\n## Engines\n", 1)[1].split("\n## ", 1)[0]
    for engine in (vllm, sglang, llamacpp):
        assert f"`{engine.FACTS.image}`" in engines, engine.FACTS.image
