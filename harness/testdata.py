"""The examples and the invalid-manifest catalog, shared by the unit and the control-plane tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from modelserve.api.spec import ModelServer

REPO = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO / "examples"
CRD_PATH = REPO / "crds" / "modelserver.yaml"
CATALOG_PATH = REPO / "tests" / "api" / "invalid_manifests.yaml"


def examples() -> dict[str, dict[str, Any]]:
    """Example file stem -> its manifest: examples/ and examples/external/ (which `make dev` does not
    apply: its servers are outside the cluster, and the sandbox reaches nothing outside)."""
    paths = sorted(EXAMPLES_DIR.glob("*.yaml")) + sorted(EXAMPLES_DIR.glob("external/*.yaml"))
    return {path.stem: yaml.safe_load(path.read_text()) for path in paths}


def model_server(name: str = "m", namespace: str = "ns", **spec: Any) -> ModelServer:
    """A ModelServer of LFM2-1.2B with `spec` on top, as the operator reads one from the API server."""
    return ModelServer.from_manifest(
        {
            "apiVersion": "serving.modelserve.dev/v1alpha1",
            "kind": "ModelServer",
            "metadata": {"name": name, "namespace": namespace, "uid": "u"},
            "spec": {"model": "LiquidAI/LFM2-1.2B", **spec},
        }
    )


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in change.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def invalid_cases() -> list[tuple[str, dict[str, Any], str, tuple[str, ...]]]:
    """(id, manifest, field the refusal must name, words it must hold) for every catalog entry."""
    catalog = yaml.safe_load(CATALOG_PATH.read_text())
    base = catalog["base"]
    cases = []
    for case in catalog["cases"]:
        manifest = copy.deepcopy(base)
        manifest["metadata"] = _merge(base["metadata"], case.get("metadata", {}))
        manifest["spec"] = _merge(base["spec"], case.get("spec", {}))
        cases.append((case["id"], manifest, case["field"], tuple(case.get("says", ()))))
    return cases
