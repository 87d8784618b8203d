"""The gateway's view of the cluster: the operator's watch-fed caches (list, then watch) of
ModelServers and of their pods (by the operator's selector label), in the watched namespaces.
Each change rebuilds that one ModelServer's entry and hands it to the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modelserve_operator.apply import Kube, api_client
from modelserve_operator.manifests import SELECTOR_LABEL
from modelserve_operator.reconcile import MODELSERVERS
from modelserve_operator.watch_cache import API_RETRY_BACKOFFS, WatchCache, Watched
from modelserve_sidecar.contract import package_version

from .contract import Key
from .directory import Model, model_of

PODS = Watched("v1", "Pod", SELECTOR_LABEL)
LISTED_WAIT_SECONDS = 0.0
USER_AGENT = f"modelserve-gateway/{package_version()}"


class KubeDiscovery:
    def __init__(self, namespaces: tuple[str, ...]) -> None:
        api = api_client()
        api.user_agent = USER_AGENT
        self.kube = Kube(api, field_manager="modelserve-gateway")  # it never writes
        self.scopes: tuple[str | None, ...] = namespaces or (None,)
        self._changed: Callable[[Any], None] = lambda update: None
        self.modelservers = WatchCache(
            self.kube, MODELSERVERS, self.scopes, self._modelserver_changed, API_RETRY_BACKOFFS
        )
        self.pods = WatchCache(self.kube, PODS, self.scopes, self._pod_changed, API_RETRY_BACKOFFS)

    def start(self, changed: Callable[[Any], None]) -> None:
        self._changed = changed
        self.modelservers.start()
        self.pods.start()

    def stop(self) -> None:
        self.modelservers.stop()
        self.pods.stop()

    def synced(self) -> bool:
        return self.modelservers.wait_listed(LISTED_WAIT_SECONDS) and self.pods.wait_listed(LISTED_WAIT_SECONDS)

    def _modelserver_changed(self, body: dict[str, Any]) -> None:
        self._refresh((body["metadata"]["namespace"], body["metadata"]["name"]))

    def _pod_changed(self, body: dict[str, Any]) -> None:
        owner = (body["metadata"].get("labels") or {}).get(SELECTOR_LABEL)
        if owner:
            self._refresh((body["metadata"]["namespace"], owner))

    def _refresh(self, key: Key) -> None:
        body = self.modelservers.get(*key)
        if body is None:
            self._changed(key)
        else:
            self._changed(model_of(body, self.pods.owned_by(*key)))


class FixedDiscovery:
    """A fixed table of models, for benchmarks and for running the gateway without a cluster."""

    def __init__(self, models: list[Model]) -> None:
        self.models = models
        self._changed: Callable[[Any], None] = lambda update: None

    def start(self, changed: Callable[[Any], None]) -> None:
        self._changed = changed
        for model in self.models:
            changed(model)

    def update(self, model: Model | Key) -> None:
        """Replace a model's entry (a Model) or remove it (its Key), as a watch event would."""
        self._changed(model)

    def stop(self) -> None:
        pass

    def synced(self) -> bool:
        return True
