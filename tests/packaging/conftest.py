"""Fixtures of the packaging tests."""

from __future__ import annotations

import subprocess

import pytest

from modelserve_sandbox.cluster import default_bin_dir
from tests.helpers.chart import Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    """The sandbox's helm binary without a cluster: lint and template need none."""
    binary = default_bin_dir() / "helm"  # built by hack/build-control-plane.sh

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    return run
