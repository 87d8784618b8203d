#!/usr/bin/env bash
# Builds CoreDNS, the cluster DNS of the sandbox, from its Go module at a pinned release (the
# module proxy only) into the cache, once. The module is built inside its own tree, so its go.mod
# (and any replace directive in it) is the one its release was built with. Later runs find the
# stamp and return at once.
set -euo pipefail

COREDNS_VERSION=1.15.0

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
BIN=$CACHE/bin
STAMP=$BIN/.coredns-version
WANT="coredns=$COREDNS_VERSION"
mkdir -p "$BIN"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" && -x $BIN/coredns ]]; then
  echo "coredns up to date in $BIN"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

start=$(date +%s)
dir=$CACHE/build/coredns
rm -rf "$dir" && mkdir -p "$dir"
src=$(cd "$dir" && go mod download -json "github.com/coredns/coredns@v$COREDNS_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$src" "$dir/src" && chmod -R u+w "$dir/src"
cd "$dir/src"
go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_VERSION" \
  -o "$BIN/coredns" .

echo "$WANT" > "$STAMP"
echo "coredns v$COREDNS_VERSION built in $(( $(date +%s) - start ))s into $BIN"
