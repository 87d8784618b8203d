"""Programs run inside the real node's cluster, as a user's in-cluster app runs: a Job's pod on
`real-0`, its output read from the pod's log once the Job has ended (bounded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelserve_sandbox.processes import wait_until

CLIENT_SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "in_cluster_client" / "calls.py"


def client_image() -> str:
    """The image hack/build-images.sh builds for in-cluster clients: the openai SDK the tests use."""
    import importlib.metadata

    return f"modelserve.local/openai-client:{importlib.metadata.version('openai')}"


def job(name: str, image: str, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    """A one-try Job, restricted-ready (non-root, no privileges), that never restarts."""
    container = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def run_job(cluster: Any, namespace: str, manifest: dict[str, Any], timeout: float) -> tuple[bool, str]:
    """Create the Job, wait (bounded) until it completed or failed; (completed, its pod's log)."""
    name = manifest["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    def ended() -> str | None:
        status = json.loads(cluster.kubectl("get", "job", name, "-n", namespace, "-o", "json").stdout).get("status", {})
        done = [c["type"] for c in status.get("conditions", []) if c["status"] == "True"]
        return next((c for c in done if c in ("Complete", "Failed")), None)

    wait_until(lambda: ended() is not None, timeout, f"Job {name} ended")
    log = cluster.kubectl("logs", f"job/{name}", "-n", namespace, check=False)
    return ended() == "Complete", log.stdout + log.stderr


def client_calls(
    cluster: Any, namespace: str, name: str, calls: list[dict], keys: dict[str, tuple[str, str]], timeout: float
) -> dict[str, dict]:
    """Run tests/fixtures/in_cluster_client/calls.py in the client image; its results by call name.
    `keys`: environment variable -> (Secret, key) the pod reads its API keys from."""
    env = [{"name": "CALLS", "value": json.dumps(calls)}]
    env += [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for var, (secret, key) in keys.items()
    ]
    manifest = job(name, client_image(), ["python", "-c", CLIENT_SCRIPT.read_text()], env)
    completed, log = run_job(cluster, namespace, manifest, timeout)
    results = {}
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "name" in entry:
            results[entry["name"]] = entry
    assert completed and len(results) == len(calls), f"the client Job {name} said:\n{log}"
    return results
