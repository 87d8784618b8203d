#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, from the package registries only,
# and caches it so a second run takes seconds:
#   - Debian packages for the sandbox's real node and image builds (hack/install-debian-packages.sh);
#   - a virtual environment .venv with modelserve (editable) and its test and engine extras;
#   - the control plane, kubelet and kube-proxy built from Go modules (hack/build-control-plane.sh);
#   - llama.cpp's llama-server built from source (hack/build-llama-server.sh);
#   - the node's images: ours from our Dockerfile, llama.cpp's, pause (hack/build-images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/install-debian-packages.sh

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "modelserve needs Python >= 3.11"'
  "$PYTHON" -m venv .venv
fi
# A stamp of pyproject.toml skips pip entirely when nothing changed.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp ]]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[test,engine]'
  rm -f .venv/.installed-* && touch "$stamp"
fi

bash hack/build-control-plane.sh
bash hack/build-llama-server.sh
bash hack/build-images.sh
