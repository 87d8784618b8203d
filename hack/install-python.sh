#!/usr/bin/env bash
# The virtual environment .venv: modelserve (editable) with its test and engine extras, and the
# sandbox's own distribution (editable, sandbox/pyproject.toml: a dev tool, never in the wheel).
# A stamp of both pyproject.toml files skips pip entirely when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "modelserve needs Python >= 3.11"'
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml sandbox/pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -f $stamp ]]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[test,engine]' -e ./sandbox
  rm -f .venv/.installed-* && touch "$stamp"
fi
