"""The chart under test, and reading what `helm template` renders."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "modelserve"
# The sandbox's Kubernetes; a helm built from its Go module (as hack/ does) would otherwise assume
# 1.20 when no cluster is asked. MINIMUM_KUBE_VERSION: the chart's (Chart.yaml kubeVersion).
KUBE_VERSION = "1.33.0"
MINIMUM_KUBE_VERSION = "1.29.0"

Helm = Callable[..., subprocess.CompletedProcess]  # the `helm` fixture


def template_args(release: str, namespace: str, *sets: str, kube_version: str = KUBE_VERSION) -> list[str]:
    """`helm template` arguments for the chart with `--set` pairs."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version]
    for pair in sets:
        args += ["--set", pair]
    return args


def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def by_kind(rendered: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in objects(rendered) if doc["kind"] == kind]


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    """A rendered container's variables with a literal value (the downward API's are the kubelet's)."""
    return {var["name"]: var["value"] for var in container.get("env", []) if "value" in var}
