#!/usr/bin/env bash
# SGLang's own command line parser, for the test that has it read the command lines the operator
# generates for a group's pods (tests/realnode/test_group_command_lines_on_node.py). No SGLang
# image is built here: the test runs the parser in the vLLM stand-in image's Python, which has
# torch, transformers and the rest of SGLang's imports, with SGLang's wheel and the few pure
# imports that image lacks unpacked into the cache and mounted into the pod. The same unpacked
# wheel is the source the derived-facts test reads (tests/engines/test_engine_source.py). Cached: a
# stamp of the pins skips it; each version has a directory of its own.
set -euo pipefail

SGLANG_VERSION=0.5.23  # the operator's pin (modelserve/engines/sglang.py); a test keeps them equal
# What importing sglang.srt.server_args needs beyond the vLLM image's packages (tried one by one).
EXTRA="ipython==9.18.1 traitlets==5.16.1 orjson==3.13.0 triton==3.9.0"

source "$(dirname "$0")/unpack-wheels.sh"
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
# For the image's Python (3.11, glibc 2.36), whatever Python runs this (SGLang's wheel is cp311,
# manylinux_2_34, since it carries Rust extensions).
unpack_wheels "SGLang $SGLANG_VERSION's parser" "$CACHE/sglang-cli/$SGLANG_VERSION" "sglang=$SGLANG_VERSION $EXTRA" \
  "manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux2014_x86_64" "" "sglang==$SGLANG_VERSION" $EXTRA
