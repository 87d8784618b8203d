dev:
	bash hack/setup.sh
	.venv/bin/modelserve-sandbox

test:
	bash hack/setup.sh
	bash hack/run-tests.sh

# The fast tier for contributors: the tests that need no control plane, no engine and no fresh install
# of the package (the markers of tests/conftest.py). They mostly wait on the processes they start
# (sidecars, the replay engine), so six pytest workers share the two cores, a module each at a time
# (its fixtures stay its own).
# Some read what hack/setup.sh made (the engines' source, llama-server, checkov): run `make test` once
# first. `make test` (and CI) still runs everything, in one process per half.
test-fast:
	bash hack/install-python.sh
	.venv/bin/pytest -m "not cluster and not engine and not install" -q -n 6 --dist loadfile

# The images, from source into the cache: ours from the Dockerfile (the operator, sidecar, gateway,
# node cache and fetch are one image) and the sandbox's engine builds (hack/build-images.sh).
images:
	bash hack/install-debian-packages.sh
	bash hack/install-python.sh
	bash hack/build-llama-server.sh
	bash hack/build-images.sh

# `REGISTRY=registry.example.com/ml make images push`: the modelserve image and the chart (an OCI
# artifact) to your registry, with your registry login (hack/push.sh says more).
push:
	bash hack/build-registry.sh
	bash hack/push.sh

# One style: ruff's formatter and linter, configured in pyproject.toml (`ruff format .` applies it);
# the one layering of modelserve/: import-linter's contracts in pyproject.toml; and the docs site,
# built strictly (mkdocs.yml): a broken link, a page left out of the nav or a moved anchor fails it
# (not with --quiet: it hides the warnings that --strict counts).
lint:
	bash hack/install-python.sh
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

# Every file derived from the code: the CRD and its chart copy, the reference pages in docs/reference/
# (the spec, settings, metrics, conditions, chart values, CLI), the diagram's copies, the golden files.
generate:
	bash hack/install-python.sh
	.venv/bin/python -m hack.generate

# The docs site on http://127.0.0.1:8000, rebuilt as pages change; mermaid.js vendored from npm first,
# so the diagrams render without the network.
docs:
	bash hack/install-python.sh
	bash hack/install-mermaid.sh
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve

.PHONY: dev test test-fast images push lint generate docs
