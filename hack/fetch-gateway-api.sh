#!/usr/bin/env bash
# The Gateway API's standard CRDs (HTTPRoute, Gateway, GatewayClass, ...) at a pinned release, from
# its Go module (sigs.k8s.io/gateway-api, the module proxy only), into the cache, once: the chart
# tests apply them to the sandbox's API server and check the chart's HTTPRoute against them. Later
# runs find the stamp and return at once.
set -euo pipefail

GATEWAY_API_VERSION=1.6.3

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
DEST=$CACHE/gateway-api
STAMP=$DEST/.version
WANT="gateway-api=$GATEWAY_API_VERSION"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "Gateway API CRDs up to date in $DEST"
  exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(cd "$work" && go mod download -json "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$src"/config/crd/standard/*.yaml "$DEST/"
chmod u+w "$DEST"/*.yaml
echo "$WANT" > "$STAMP"
echo "Gateway API v$GATEWAY_API_VERSION standard CRDs in $DEST: $(ls "$DEST" | tr '\n' ' ')"
