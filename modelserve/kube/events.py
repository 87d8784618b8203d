"""An Event about a program's own pod (its name and namespace from the downward API), for a reason
it cannot serve that the pod's status would otherwise show only as a crash loop: `kubectl describe
pod` and `kubectl get events` then name it. Posted with the pod's service account (`create events`
in its own namespace)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from urllib3.exceptions import HTTPError

from modelserve.contracts.events import event_manifest

from .apply import Kube, api_client, error_message


def pod_event(
    namespace: str, pod: str, type_: str, reason: str, message: str, component: str, now: str
) -> dict[str, Any]:
    """A core/v1 Event about the pod `namespace/pod`, from `component`."""
    involved = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace}
    return event_manifest(involved, type_, reason, message, component, pod, now)


def post_pod_event(namespace: str, pod: str, type_: str, reason: str, message: str, component: str) -> str | None:
    """Posts the Event; None when it was, else why not (no pod named, no API server, a refusal), for
    the caller's log: a program on its way out never fails for want of an Event."""
    if not namespace or not pod:
        return "no pod named (its name and namespace from the downward API are unset)"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        Kube(api_client()).create(pod_event(namespace, pod, type_, reason, message, component, now))
    except ApiException as error:
        return f"the API server refused it: {error_message(error)}"
    except (ConfigException, HTTPError, OSError, ValueError) as error:  # no kubeconfig, no API server
        return f"the API server could not be reached: {error}"
    return None
