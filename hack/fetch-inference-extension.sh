#!/usr/bin/env bash
# The Gateway API Inference Extension's v1 InferencePool CRD at a pinned release, from its Go module
# (sigs.k8s.io/gateway-api-inference-extension, the module proxy only: it serves exact versions, so
# always a pin, never @latest), into the cache, once: the cluster tests apply it to the sandbox's API
# server (the operator's pools, what the API server refuses), and the chart ships the same file as an
# optional template (hack.generate copies it). Later runs find the stamp and return at once.
set -euo pipefail

GIE_VERSION=1.6.0
CRD=config/crd/bases/inference.networking.k8s.io_inferencepools.yaml

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
DEST=$CACHE/inference-extension
STAMP=$DEST/.version
WANT="gateway-api-inference-extension=$GIE_VERSION"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "InferencePool CRD up to date in $DEST"
  exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(cd "$work" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@v$GIE_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$src/$CRD" "$DEST/"
chmod u+w "$DEST"/*.yaml
echo "$WANT" > "$STAMP"
echo "Gateway API Inference Extension v$GIE_VERSION InferencePool CRD in $DEST"
