"""Talking to the API server, the pure parts: its refusals (bodies as it sends them), paths, comparisons."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from modelserve.kube.apply import contains, error_message, fingerprint, is_gone, path

TERMINATING = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'events "small." is forbidden: unable to create new content in namespace t-1 because it is being '
    "terminated",
    "reason": "Forbidden",
    "details": {
        "name": "small.",
        "kind": "events",
        "causes": [{"reason": "NamespaceTerminating", "message": "namespace t-1 is being terminated"}],
    },
    "code": 403,
}
INVALID = {
    "kind": "Status",
    "status": "Failure",
    "reason": "Invalid",
    "code": 422,
    "message": 'Service "small" is invalid: spec.ports[1].name: Duplicate value: "http"',
}


def test_a_terminating_namespace_or_a_missing_object_is_gone() -> None:
    assert is_gone(ApiException(status=403, reason="Forbidden", body=json.dumps(TERMINATING)))
    assert is_gone(ApiException(status=404, reason="Not Found"))
    assert not is_gone(ApiException(status=422, reason="Unprocessable Entity", body=json.dumps(INVALID)))
    assert not is_gone(ApiException(status=403, reason="Forbidden", body="not json"))


def test_error_message_is_the_api_servers_own() -> None:
    assert error_message(ApiException(status=422, body=json.dumps(INVALID))) == INVALID["message"]
    assert error_message(ApiException(status=500, reason="Internal Server Error")) == "500 Internal Server Error"


def test_paths_for_core_grouped_and_cluster_wide_collections() -> None:
    assert path("v1", "Secret", "ns", "k") == "/api/v1/namespaces/ns/secrets/k"
    assert path("apps/v1", "Deployment", "ns") == "/apis/apps/v1/namespaces/ns/deployments"
    ms = path("serving.modelserve.dev/v1alpha1", "ModelServer", "ns", "m", "status")
    assert ms == "/apis/serving.modelserve.dev/v1alpha1/namespaces/ns/modelservers/m/status"
    every = path("serving.modelserve.dev/v1alpha1", "ModelServer", None)
    assert every == "/apis/serving.modelserve.dev/v1alpha1/modelservers"


def test_contains_is_what_server_side_apply_would_leave_alone() -> None:
    desired = {"spec": {"replicas": 1, "ports": [{"name": "http", "port": 80}], "limits": {"gpu": 1}}}
    defaulted = {
        "spec": {"replicas": 1, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], "limits": {"gpu": "1"}}
    }
    assert contains(defaulted, desired)
    assert not contains({"spec": {"replicas": 3, "ports": defaulted["spec"]["ports"]}}, desired)
    extra_port = [*defaulted["spec"]["ports"], {"name": "x", "port": 81}]
    assert not contains({"spec": {**defaulted["spec"], "ports": extra_port}}, desired)  # ask the API server
    assert not contains({"spec": {"ports": defaulted["spec"]["ports"], "limits": {"gpu": "1"}}}, desired)


def test_fingerprint_follows_content_not_key_order() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
