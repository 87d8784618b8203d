#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, from the package registries only,
# and caches it so a second run takes seconds:
#   - a virtual environment .venv with modelserve (editable) and its test and engine extras
#     (llama-cpp-python builds from source once, into a wheel kept in the cache directory);
#   - the control plane binaries built from Go modules (hack/build-control-plane.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
WHEELS=$CACHE/wheels
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "modelserve needs Python >= 3.11"'
  "$PYTHON" -m venv .venv
fi
# A stamp of pyproject.toml skips pip entirely when nothing changed.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp ]]; then
  .venv/bin/pip install --quiet --upgrade pip
  # llama.cpp builds for the native CPU by default; these VMs advertise AMX but trap on its
  # instructions (SIGILL at the first generation), so build a portable AVX2 engine instead,
  # once, into our own wheel cache (pip's own cache would hand back a native build).
  llama=$(grep -oE 'llama-cpp-python\[server\]==[0-9.]+' pyproject.toml | cut -d= -f3)
  if ! ls "$WHEELS"/llama_cpp_python-"$llama"-*.whl >/dev/null 2>&1; then
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
      .venv/bin/pip wheel --quiet --no-deps --no-cache-dir -w "$WHEELS" "llama-cpp-python==$llama"
  fi
  .venv/bin/pip install --quiet --find-links "$WHEELS" -e '.[test,engine]'
  rm -f .venv/.installed-* && touch "$stamp"
fi

bash hack/build-control-plane.sh
