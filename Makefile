dev:
	bash hack/setup.sh
	.venv/bin/modelserve-sandbox

test:
	bash hack/setup.sh
	.venv/bin/pytest

.PHONY: dev test
