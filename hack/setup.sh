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
#   - the sandbox's private registry and crane, from go-containerregistry's module, for the install
#     from a registry (hack/build-registry.sh);
#   - the Gateway API's standard CRDs from its Go module, for the chart's HTTPRoute tests
#     (hack/fetch-gateway-api.sh), and the Gateway API Inference Extension's InferencePool CRD for the
#     operator's pools (hack/fetch-inference-extension.sh);
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
step() { # script -> runs it, records its wall seconds (its failure is the step's, whatever the caller)
  local start=$SECONDS
  bash "$1" || return $?
  printf 'set-up %-34s %5d s\n' "$1" $((SECONDS - start)) | tee -a "$TIMES"
}
lane() { # scripts... -> each in turn, stopping at the first that fails
  local script
  for script in "$@"; do
    step "$script" || return $?
  done
}

step hack/install-debian-packages.sh
step hack/install-python.sh
# Two lanes at once, on a cold machine: the Go builds (module downloads, then compiles) beside
# llama.cpp's compile and the images (a 6 GB vLLM image's downloads and unpacking), so one lane's
# waits on the network and the disk overlap the other's compiles. Neither reads what the other makes.
GO_LOG=build/setup-go-lane.log
lane hack/build-control-plane.sh hack/build-lws.sh hack/build-coredns.sh hack/build-rulecheck.sh \
  hack/build-registry.sh hack/fetch-gateway-api.sh hack/fetch-inference-extension.sh >"$GO_LOG" 2>&1 &
go_lane=$!
trap 'kill "$go_lane" 2>/dev/null || true' EXIT
lane hack/install-vllm-cli.sh hack/install-sglang-cli.sh hack/build-llama-server.sh hack/install-checkov.sh \
  hack/build-images.sh
status=0
wait "$go_lane" || status=$?
trap - EXIT
cat "$GO_LOG"
if ((status != 0)); then
  echo "set-up: the Go builds failed (exit $status); their output is above and in $GO_LOG" >&2
  exit "$status"
fi
