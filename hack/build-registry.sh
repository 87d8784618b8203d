#!/usr/bin/env bash
# Builds the sandbox's private registry (hack/registry: go-containerregistry's registry behind basic
# auth) and crane, the image pusher of hack/push.sh, from the pinned go-containerregistry module (the
# module proxy only) into the cache, once. The chart's real-node test pushes the images and the chart
# to it and installs from it (tests/realnode/test_chart_on_node.py). Later runs find the stamp and
# return at once.
set -euo pipefail
cd "$(dirname "$0")/.."

GGCR_VERSION=0.22.1 # the version hack/registry/go.mod requires

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
BIN=$CACHE/bin
STAMP=$BIN/.registry-version
# The sources' hash too: a change to hack/registry builds again.
WANT="go-containerregistry=$GGCR_VERSION sources=$(cat hack/registry/go.mod hack/registry/go.sum hack/registry/*.go | sha256sum | cut -c1-16)"
mkdir -p "$BIN"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" && -x $BIN/registry && -x $BIN/crane ]]; then
  echo "registry and crane up to date in $BIN"
  exit 0
fi

grep -q "github.com/google/go-containerregistry v$GGCR_VERSION\$" hack/registry/go.mod ||
  { echo "hack/registry/go.mod does not require go-containerregistry v$GGCR_VERSION" >&2; exit 1; }

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

start=$(date +%s)
cd hack/registry
go build -trimpath -ldflags "-s -w" -o "$BIN/registry" .
go build -trimpath -ldflags "-s -w" -o "$BIN/crane" github.com/google/go-containerregistry/cmd/crane

echo "$WANT" > "$STAMP"
echo "registry and crane (go-containerregistry v$GGCR_VERSION) built in $(( $(date +%s) - start ))s into $BIN"
