#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, from the package registries only,
# and caches it so a second run takes seconds:
#   - a virtual environment .venv with modelserve (editable) and its test and engine extras
#     (llama-cpp-python builds from source once; pip keeps the built wheel in its cache);
#   - the control plane binaries built from Go modules (hack/build-control-plane.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "modelserve needs Python >= 3.11"'
  "$PYTHON" -m venv .venv
fi
# A stamp of pyproject.toml skips pip entirely when nothing changed.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp ]]; then
  # llama.cpp builds for the native CPU; these VMs report AMX but trap on its instructions
  # (SIGILL in tilezero on the first generation), so leave the AMX kernels out.
  export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[test,engine]'
  rm -f .venv/.installed-* && touch "$stamp"
fi

bash hack/build-control-plane.sh
