#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, from the package registries only,
# and caches it so a second run takes seconds:
#   - Debian packages for the sandbox's real node and image builds (hack/install-debian-packages.sh);
#   - a virtual environment .venv with modelserve (editable) and its test and engine extras
#     (hack/install-python.sh);
#   - the control plane, kubelet and kube-proxy built from Go modules (hack/build-control-plane.sh);
#   - the LeaderWorkerSet controller and its CRDs, from its Go module (hack/build-lws.sh);
#   - CoreDNS, the sandbox's cluster DNS, from its Go module (hack/build-coredns.sh);
#   - vLLM's and SGLang's source at the pins: their parsers check the generated command lines, and the
#     derived-facts test reads their routes and flags (hack/install-vllm-cli.sh, hack/install-sglang-cli.sh);
#   - llama.cpp's llama-server built from source (hack/build-llama-server.sh);
#   - checkov, the manifest scanner of the security tests, in a venv of its own (hack/install-checkov.sh);
#   - the node's images: ours from our Dockerfile, llama.cpp's, pause (hack/build-images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/install-debian-packages.sh

bash hack/install-python.sh
bash hack/build-control-plane.sh
bash hack/build-lws.sh
bash hack/build-coredns.sh
bash hack/install-vllm-cli.sh
bash hack/install-sglang-cli.sh
bash hack/build-llama-server.sh
bash hack/install-checkov.sh
bash hack/build-images.sh
