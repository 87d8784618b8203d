#!/usr/bin/env bash
# Builds rulecheck (hack/rulecheck): `promtool check rules` and `promtool test rules` from the pinned
# Prometheus module (the module proxy only) into the cache, once, for the chart's PrometheusRule
# tests (tests/packaging/test_prometheus_rule.py). promtool itself is not built: its service
# discovery pulls every cloud SDK: cold on 2 cores beside a CI run, 572 s (492 s of CPU) and 272 MB
# of modules, against 109 s (110 s of CPU) and 139 MB for this. `test` is promtool's own unittest.go,
# copied from the very module version built. Later runs find the stamp and return at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMETHEUS_VERSION=0.316.0 # the version hack/rulecheck/go.mod requires

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
BIN=$CACHE/bin
STAMP=$BIN/.rulecheck-version
# The sources' hash too: a change to hack/rulecheck builds again.
WANT="prometheus=$PROMETHEUS_VERSION sources=$(cat hack/rulecheck/go.mod hack/rulecheck/go.sum hack/rulecheck/main.go | sha256sum | cut -c1-16)"
mkdir -p "$BIN"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" && -x $BIN/rulecheck ]]; then
  echo "rulecheck up to date in $BIN"
  exit 0
fi

grep -q "github.com/prometheus/prometheus v$PROMETHEUS_VERSION\$" hack/rulecheck/go.mod ||
  { echo "hack/rulecheck/go.mod does not require prometheus v$PROMETHEUS_VERSION" >&2; exit 1; }

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

start=$(date +%s)
dir=$CACHE/build/rulecheck
rm -rf "$dir" && mkdir -p "$dir"
cp hack/rulecheck/go.mod hack/rulecheck/go.sum hack/rulecheck/main.go "$dir/"
cd "$dir"
src=$(go mod download -json "github.com/prometheus/prometheus@v$PROMETHEUS_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
cp "$src/cmd/promtool/unittest.go" . && chmod u+w unittest.go
go build -trimpath -ldflags "-s -w" -o "$BIN/rulecheck" .

echo "$WANT" > "$STAMP"
echo "rulecheck (prometheus v$PROMETHEUS_VERSION's rule checks) built in $(( $(date +%s) - start ))s into $BIN"
