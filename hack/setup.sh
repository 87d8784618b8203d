#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, from the package registries only,
# and caches it so a second run takes seconds:
#   - Debian packages for the sandbox's real node and image builds (hack/install-debian-packages.sh);
#   - a virtual environment .venv with modelserve (editable) and its test and engine extras
#     (hack/install-python.sh);
#   - the control plane, kubelet and kube-proxy built from Go modules (hack/build-control-plane.sh);
#   - the LeaderWorkerSet controller and its CRDs, from its Go module (hack/build-lws.sh);
#   - CoreDNS, the sandbox's cluster DNS, from its Go module (hack/build-coredns.sh);
#   - rulecheck, Prometheus's rule checks and rule unit tests (promtool's) from its Go module, for the
#     chart's PrometheusRule tests (hack/build-rulecheck.sh);
#   - vLLM's and SGLang's source at the pins: their parsers check the generated command lines, and the
#     derived-facts test reads their routes and flags (hack/install-vllm-cli.sh, hack/install-sglang-cli.sh);
#   - llama.cpp's llama-server built from source (hack/build-llama-server.sh);
#   - checkov, the manifest scanner of the security tests, in a venv of its own (hack/install-checkov.sh);
#   - the node's images: ours from our Dockerfile, llama.cpp's, pause (hack/build-images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's seconds go to build/setup-times.txt (and to the terminal): hack/run-tests.sh prints
# them again in its last lines, where CI's tail shows where a run's set-up went.
TIMES=build/setup-times.txt
mkdir -p build && : >"$TIMES"
step() { # script -> runs it, records its wall seconds
  local start=$SECONDS
  bash "$1"
  printf 'set-up %-34s %5d s\n' "$1" $((SECONDS - start)) | tee -a "$TIMES"
}

step hack/install-debian-packages.sh
step hack/install-python.sh
step hack/build-control-plane.sh
step hack/build-lws.sh
step hack/build-coredns.sh
step hack/build-rulecheck.sh
step hack/install-vllm-cli.sh
step hack/install-sglang-cli.sh
step hack/build-llama-server.sh
step hack/install-checkov.sh
step hack/build-images.sh
