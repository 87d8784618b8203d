"""The committed CRD is exactly what the spec model generates, and it is a structural schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from harness.testdata import CRD_PATH
from modelserve.api import crd

REGENERATE = "make generate"


def _schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(node: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{where}{{}}")


def test_committed_crd_matches_the_model() -> None:
    assert CRD_PATH.read_text() == crd.render(), f"crds/modelserver.yaml is stale: run `{REGENERATE}`"


def test_rendering_is_byte_stable() -> None:
    assert crd.render() == crd.render()


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "nullable", "title"}
    for where, node in _nodes(_schema()):
        assert "type" in node, f"{where or '<root>'} has no type"
        assert not forbidden & node.keys(), f"{where} keeps {forbidden & node.keys()}"
        assert node.get("additionalProperties") is not False, where
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, where


def test_every_spec_field_is_described_for_kubectl_explain() -> None:
    spec = _schema()["properties"]["spec"]
    undescribed = [
        where
        for where, node in _nodes(spec, "spec")
        if where.count(".") and not node.get("description") and not where.endswith(("[]", "}"))
    ]
    assert not undescribed


def test_identity_printer_columns_and_status_subresource() -> None:
    document = yaml.safe_load(CRD_PATH.read_text())
    spec = document["spec"]
    assert document["metadata"]["name"] == "modelservers.serving.modelserve.dev"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["shortNames"]) == (
        "serving.modelserve.dev",
        "Namespaced",
        "ModelServer",
        ["ms"],
    )
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]  # kubectl scale, HPA, KEDA
    assert scale == {
        "specReplicasPath": ".spec.replicas.count",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert {"Model", "Profile", "Ready", "Replicas", "Endpoint", "Age"} <= set(columns)


def test_every_cel_rule_names_the_field_it_blames() -> None:
    spec = _schema()["properties"]["spec"]
    rules = [rule for _, node in _nodes(spec) for rule in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 15
    for rule in rules:
        assert rule["fieldPath"].startswith(".") and rule["message"] and rule["reason"] == "FieldValueInvalid"
    name_rule, adapter_name_rule = _schema()["x-kubernetes-validations"]
    assert "metadata.name" in name_rule["message"]
    assert adapter_name_rule["fieldPath"] == ".spec.adapters" and "self.metadata.name" in adapter_name_rule["rule"]


def test_defaults_are_filled_in_by_the_api_server() -> None:
    # Whole-object defaults: CEL rules on replicas see complete objects even when the user wrote none.
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == {
        "min": 1,
        "buffer": 0,
        "max": 1,
        "scaleDownDelaySeconds": 300,
        "idleWindowSeconds": 600,
    }
    assert spec["auth"]["default"] == {"mode": "private"}
    assert spec["profile"]["default"] == "high-throughput"
