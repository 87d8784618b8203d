#!/usr/bin/env bash
# checkov, the Kubernetes manifest scanner the security tests run over the rendered examples and the
# chart, in a virtual environment of its own: it pins many dependencies of its own, which must not
# decide the project's. Cached in $MODELSERVE_CACHE (shared by every clone); a stamp of the pinned
# version skips pip once it is there.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECKOV_VERSION=3.3.30  # keep in step with sandbox/modelserve_sandbox/checkov.py
CACHE=${MODELSERVE_CACHE:-$HOME/.cache/modelserve}
VENV=$CACHE/checkov-$CHECKOV_VERSION
PYTHON=${PYTHON:-python3}
if [[ ! -f $VENV/.installed ]]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "checkov==$CHECKOV_VERSION"
  "$VENV/bin/checkov" --version
  touch "$VENV/.installed"
fi
