"""The gateway's view of the cluster: the operator's watch-fed caches (list, then watch) of
ModelServers and of their pods (by the operator's selector label), in the watched namespaces.
A change names the ModelServer it touched; the event loop then reads that ModelServer's entry
from the caches as they are at that moment, so entries never arrive out of order from the
watch threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modelserve.contracts.names import PACKAGE_VERSION, SELECTOR_LABEL, Key
from modelserve.kube.apply import Kube, api_client
from modelserve.kube.watch_cache import API_RETRY_BACKOFFS, MODELSERVERS, WatchCache, Watched

from .directory import Model, model_of

PODS = Watched("v1", "Pod", SELECTOR_LABEL)
LISTED_WAIT_SECONDS = 0.0
USER_AGENT = f"modelserve-gateway/{PACKAGE_VERSION}"


class KubeDiscovery:
    def __init__(self, namespaces: tuple[str, ...]) -> None:
        api = api_client()
        api.user_agent = USER_AGENT
        self.kube = Kube(api, field_manager="modelserve-gateway")  # it never writes
        self.scopes: tuple[str | None, ...] = namespaces or (None,)
        self._changed: Callable[[Key], None] = lambda key: None
        self.modelservers = WatchCache(
            self.kube, MODELSERVERS, self.scopes, self._modelserver_changed, API_RETRY_BACKOFFS
        )
        self.pods = WatchCache(self.kube, PODS, self.scopes, self._pod_changed, API_RETRY_BACKOFFS)

    def start(self, changed: Callable[[Key], None]) -> None:
        self._changed = changed
        self.modelservers.start()
        self.pods.start()

    def stop(self) -> None:
        self.modelservers.stop()
        self.pods.stop()

    def synced(self) -> bool:
        return self.modelservers.wait_listed(LISTED_WAIT_SECONDS) and self.pods.wait_listed(LISTED_WAIT_SECONDS)

    def lookup(self, key: Key) -> Model | None:
        """The ModelServer's entry now, or None when it is gone."""
        body = self.modelservers.get(*key)
        return None if body is None else model_of(body, self.pods.owned_by(*key))

    def _modelserver_changed(self, body: dict[str, Any]) -> None:
        self._changed((body["metadata"]["namespace"], body["metadata"]["name"]))

    def _pod_changed(self, body: dict[str, Any]) -> None:
        owner = (body["metadata"].get("labels") or {}).get(SELECTOR_LABEL)
        if owner:
            self._changed((body["metadata"]["namespace"], owner))


class FixedDiscovery:
    """A fixed table of models, for benchmarks and for running the gateway without a cluster."""

    def __init__(self, models: list[Model]) -> None:
        self.models = {model.key: model for model in models}
        self._changed: Callable[[Key], None] = lambda key: None

    def start(self, changed: Callable[[Key], None]) -> None:
        self._changed = changed
        for key in self.models:
            changed(key)

    def lookup(self, key: Key) -> Model | None:
        return self.models.get(key)

    def update(self, model: Model | Key) -> None:
        """Replace a model's entry (a Model) or remove it (its Key), as a watch event would."""
        if isinstance(model, Model):
            self.models[model.key] = model
            self._changed(model.key)
        else:
            self.models.pop(model, None)
            self._changed(model)

    def stop(self) -> None:
        pass

    def synced(self) -> bool:
        return True
