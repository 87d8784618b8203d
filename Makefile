dev:
	bash hack/setup.sh
	.venv/bin/modelserve-sandbox

test:
	bash hack/setup.sh
	.venv/bin/pytest

# One style: ruff's formatter and linter, configured in pyproject.toml (`ruff format .` applies it);
# and the one layering of modelserve/: import-linter's contracts in pyproject.toml.
lint:
	bash hack/install-python.sh
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/lint-imports

# Every file derived from the code: the CRD and its chart copy, the README's spec table, the golden files.
generate:
	bash hack/install-python.sh
	.venv/bin/python hack/generate.py

.PHONY: dev test lint generate
