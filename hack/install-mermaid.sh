#!/usr/bin/env bash
# mermaid.js for the docs site (`make docs`): the diagram in docs/diagrams/flow.mmd is rendered by the
# browser, and mkdocs-material would load mermaid from a CDN; vendored here from the npm registry
# (`npm pack`, pinned by version and checksum, cached), the site renders it without the network.
# Not needed by `make lint`: the build checks the pages, not the drawing. Needs Node.js's npm.
set -euo pipefail
cd "$(dirname "$0")/.."

MERMAID_VERSION=${MERMAID_VERSION:-11.17.2}  # mkdocs-material 9.8 drives mermaid 11
INTEGRITY=sha512-V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/qt5gHO73aCleBBg==
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}/mermaid-$MERMAID_VERSION
TARGET=docs/assets/javascripts/mermaid.min.js

if [[ ! -f $CACHE/mermaid.min.js ]]; then
  command -v npm >/dev/null || { echo "install-mermaid: npm (Node.js) is needed to fetch mermaid" >&2; exit 1; }
  mkdir -p "$CACHE"
  tarball=$CACHE/mermaid-$MERMAID_VERSION.tgz
  (cd "$CACHE" && npm pack --silent "mermaid@$MERMAID_VERSION" >/dev/null)
  actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  [[ $actual == "$INTEGRITY" ]] || { echo "install-mermaid: $tarball: checksum $actual, expected $INTEGRITY" >&2; exit 1; }
  tar -xzf "$tarball" -C "$CACHE" package/dist/mermaid.min.js
  mv "$CACHE/package/dist/mermaid.min.js" "$CACHE/mermaid.min.js"
  rm -rf "$CACHE/package" "$tarball"
fi
mkdir -p "$(dirname "$TARGET")"
cmp -s "$CACHE/mermaid.min.js" "$TARGET" 2>/dev/null || cp "$CACHE/mermaid.min.js" "$TARGET"
