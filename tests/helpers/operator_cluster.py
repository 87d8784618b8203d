"""Reading and waiting on ModelServers and their children through real kubectl."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import tail, wait_until

WAIT_SECONDS = 60
RESYNC_SECONDS = 2  # the operator under test resyncs this often


class OperatorView:
    def __init__(self, cluster: Cluster, namespace: str, operator_log: Path):
        self.cluster = cluster
        self.namespace = namespace
        self.operator_log = operator_log

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> Any:
        return self.cluster.kubectl(*args, "-n", self.namespace, check=check, input=input)

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-o", "json", "--ignore-not-found", check=False)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout) if result.stdout.strip() else None

    def events(self, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind=ModelServer"
        return json.loads(self.kubectl("get", "events", "--field-selector", selector, "-o", "json").stdout)["items"]

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        ms = self.get("modelserver", name) or {}
        return next((c for c in ms.get("status", {}).get("conditions", []) if c["type"] == type_), {})

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> None:
        wait_until(
            lambda: bool(condition()),
            timeout,
            what,
            interval=0.5,
            on_timeout=lambda: f"\noperator log:\n{tail(self.operator_log, 40)}",
        )

    def wait_ready(self, name: str, generation: int | None = None, timeout: float = WAIT_SECONDS) -> dict[str, Any]:
        def ready() -> bool:
            ms = self.get("modelserver", name) or {}
            status = ms.get("status", {})
            current = generation or ms.get("metadata", {}).get("generation")
            return status.get("phase") == "Ready" and status.get("observedGeneration") == current

        self.wait(ready, f"ModelServer {name} Ready", timeout)
        return self.get("modelserver", name) or {}

    def wait_reason(
        self, name: str, type_: str, status: str, reason: str, timeout: float = WAIT_SECONDS
    ) -> dict[str, Any]:
        matched: dict[str, Any] = {}

        def matches() -> bool:
            condition = self.condition(name, type_)
            if (condition.get("status"), condition.get("reason")) == (status, reason):
                matched.update(condition)
            return bool(matched)

        self.wait(matches, f"ModelServer {name} {type_}={status} ({reason})", timeout)
        return matched  # as matched: it may move on before a second read
