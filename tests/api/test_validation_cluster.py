"""The API server refuses every manifest of the invalid catalog at `kubectl apply`, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.testdata import examples, invalid_cases
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import wait_until

CASES = invalid_cases()


@pytest.mark.parametrize(("case_id", "manifest", "field", "says"), CASES, ids=[case[0] for case in CASES])
def test_invalid_manifest_is_refused_naming_the_field(
    cluster: Cluster,
    crd_installed: None,
    namespace: str,
    case_id: str,
    manifest: dict[str, Any],
    field: str,
    says: tuple[str, ...],
) -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{case_id} was accepted"
    assert field in result.stderr, result.stderr
    assert all(words in result.stderr for words in says), result.stderr
    name = manifest["metadata"]["name"]
    assert not cluster.kubectl("get", "ms", name, "-n", namespace, "--ignore-not-found", "-o", "name").stdout


def test_examples_are_accepted_and_defaulted(cluster: Cluster, crd_installed: None, namespace: str) -> None:
    def dry_run(manifest: dict[str, Any]) -> dict[str, Any]:
        result = cluster.kubectl(
            "apply", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(manifest)
        )
        return json.loads(result.stdout)

    stored = {name: dry_run(manifest)["spec"] for name, manifest in examples().items()}
    cpu = stored["smollm2-135m-cpu"]
    # No targetPerReplica: unset, it is the profile's default, which the operator computes (issue 45).
    autoscaling = {"scaleDownDelaySeconds": 300, "idleWindowSeconds": 600}
    assert cpu["replicas"] == {"min": 1, "buffer": 0, "max": 1, **autoscaling} and cpu["dtype"] == "auto"
    assert cpu["auth"] == {"mode": "public"} and cpu["torchCompile"] is False
    assert stored["lfm2-1.2b"]["auth"] == {"mode": "private"}


@pytest.mark.parametrize(
    ("profile", "loader"), [("high-throughput", "runai_streamer"), ("low-latency", "fastsafetensors")]
)
def test_an_offered_load_format_is_accepted(
    cluster: Cluster, crd_installed: None, namespace: str, profile: str, loader: str
) -> None:
    # The catalog holds the refused loadFormats; the CEL rules let the offered ones through.
    manifest = examples()["lfm2-1.2b"]
    manifest = {**manifest, "spec": {**manifest["spec"], "profile": profile, "loadFormat": loader}}
    result = cluster.kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(manifest)
    )
    assert json.loads(result.stdout)["spec"]["loadFormat"] == loader


def test_kubectl_explain_shows_the_field_descriptions(cluster: Cluster, crd_installed: None) -> None:
    def explained() -> bool:
        result = cluster.kubectl("explain", "modelserver.spec.gpus", check=False)
        return result.returncode == 0 and "GPUs per replica" in result.stdout

    # The API server publishes a new CRD's OpenAPI a moment after it is Established.
    wait_until(explained, 60, "kubectl explain modelserver.spec.gpus", interval=1.0)
    replicas = cluster.kubectl("explain", "ms.spec.replicas").stdout
    assert "buffer" in replicas and "Idle replicas kept above current demand" in replicas
