#!/usr/bin/env bash
# Builds the test control plane from Go modules (the module proxy only) into a cache
# directory outside the work tree, once; later runs find the binaries and return at once.
# Binaries: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy,
# etcd, kwok, helm (kubelet and kube-proxy run the sandbox's real node).
set -euo pipefail

KUBE_VERSION=1.33.13
ETCD_VERSION=3.5.35
KWOK_VERSION=0.7.0
HELM_VERSION=3.21.4

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
BIN=$CACHE/bin
STAMP=$BIN/.versions
WANT="kube=$KUBE_VERSION+node etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION"
mkdir -p "$BIN"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "control plane binaries up to date in $BIN"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The k8s tree still holds //go:linkname uses that newer Go linkers refuse by default.
LDFLAGS_COMMON="-s -w -checklinkname=0"

build_kubernetes() {
  local dir=$CACHE/build/kubernetes minor=${KUBE_VERSION#1.}
  minor=${minor%%.*}
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local/k8sbuild >/dev/null 2>&1
  local staging="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
    endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
    kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
    sample-apiserver sample-cli-plugin sample-controller"
  for m in $staging; do
    go mod edit -replace="k8s.io/$m=k8s.io/$m@v0.${KUBE_VERSION#1.}"
  done
  go mod edit -require="k8s.io/kubernetes@v$KUBE_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  go mod tidy
  local x=k8s.io/component-base/version
  go build -trimpath -ldflags "$LDFLAGS_COMMON -X $x.gitVersion=v$KUBE_VERSION -X $x.gitMajor=1 \
    -X $x.gitMinor=$minor -X $x.gitTreeState=clean" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
}

build_etcd() {
  local dir=$CACHE/build/etcd
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local/etcdbuild >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go mod tidy
  go build -trimpath -ldflags "$LDFLAGS_COMMON" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_go_tool() { # module path, version
  GOBIN=$BIN go install -trimpath -ldflags "$LDFLAGS_COMMON" "$1@$2"
}

start=$(date +%s)
echo "building etcd v$ETCD_VERSION";        build_etcd
echo "building kwok v$KWOK_VERSION";        build_go_tool sigs.k8s.io/kwok/cmd/kwok "v$KWOK_VERSION"
echo "building helm v$HELM_VERSION";        build_go_tool helm.sh/helm/v3/cmd/helm "v$HELM_VERSION"
echo "building kubernetes v$KUBE_VERSION";  build_kubernetes
echo "$WANT" > "$STAMP"
echo "control plane built in $(( $(date +%s) - start ))s into $BIN"
