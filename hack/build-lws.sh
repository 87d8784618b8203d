#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (kubernetes-sigs/lws) from its Go module at a pinned
# release (the module proxy only) into the cache, with its CRD copied from the same module:
# the sandbox runs it beside the control plane so multi-node ModelServers meet the real thing.
# Later runs find the stamp and return at once.
set -euo pipefail

LWS_VERSION=0.9.0

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
BIN=$CACHE/bin
CRD_DIR=$CACHE/lws-crd
STAMP=$BIN/.lws-version
WANT="lws=$LWS_VERSION"
mkdir -p "$BIN"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" && -x $BIN/lws-manager ]]; then
  echo "lws-manager up to date in $BIN"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

start=$(date +%s)
dir=$CACHE/build/lws
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
# A module of our own requiring lws alone, so nothing else lifts its dependencies.
go mod init local/lwsbuild >/dev/null 2>&1
go mod edit -require="sigs.k8s.io/lws@v$LWS_VERSION"
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/lws/cmd"
GO
go mod tidy
go build -trimpath -ldflags "-s -w" -o "$BIN/lws-manager" sigs.k8s.io/lws/cmd

# The CRD from the very module version built above (the controller and its schema agree).
src=$(go list -m -f '{{.Dir}}' "sigs.k8s.io/lws")/config/crd/bases
rm -rf "$CRD_DIR" && mkdir -p "$CRD_DIR"
cp "$src"/*.yaml "$CRD_DIR/"
chmod u+w "$CRD_DIR"/*.yaml

echo "$WANT" > "$STAMP"
echo "lws-manager v$LWS_VERSION built in $(( $(date +%s) - start ))s into $BIN"
