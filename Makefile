dev:
	bash hack/setup.sh
	.venv/bin/modelserve-sandbox

test:
	bash hack/setup.sh
	.venv/bin/pytest

# One style: ruff's formatter and linter, configured in pyproject.toml (`ruff format .` applies it).
lint:
	bash hack/install-python.sh
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .

.PHONY: dev test lint
