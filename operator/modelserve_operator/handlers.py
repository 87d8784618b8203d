"""kopf wiring, kept thin: every event names one ModelServer, and reconcile does the rest.

Only watching handlers (`kopf.on.event`) and no timers: they need no finalizer and keep no state
in the objects, so deleting a ModelServer never waits for the operator and an unchanged object
is never written.
"""

from __future__ import annotations

from typing import Any

import kopf

from .apply import Kube, api_client
from .manifests import SELECTOR_LABEL
from .reconcile import Reconciler, Resync
from .settings import Settings
from .spec import GROUP, PLURAL, VERSION

CHILD = {SELECTOR_LABEL: kopf.PRESENT}
# kopf retries a failed API request (watches included) after 1, 1, 2, 3, 5, 8, 13 and 21 s: after an
# API server outage the operator could sleep up to 21 s more before it saw anything. Retry every
# 2 s at most instead, for as long as kopf's default (~54 s) and more: ~90 s before a request fails.
API_RETRY_BACKOFFS = (0.5, 1.0, *([2.0] * 44))


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # the reconciler posts its own Events, one per transition
    settings.networking.error_backoffs = API_RETRY_BACKOFFS
    operator_settings = Settings.from_env()
    memo.reconciler = Reconciler(Kube(api_client()), operator_settings)
    memo.resync = Resync(memo.reconciler, operator_settings.resync_seconds, tuple(memo.get("namespaces", ())))
    memo.resync.start()


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.stop()


@kopf.on.event(GROUP, VERSION, PLURAL)
def modelserver_changed(type: str | None, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    if type != "DELETED":
        memo.reconciler.reconcile(namespace, name)


# Children whose changes matter at once: drift to repair (Deployment, Service, claim) or status to
# report (Deployment, pods). Secrets are left to the resync: watching them would stream every
# Secret of the cluster through the operator.
@kopf.on.event("apps", "v1", "deployments", id="deployment-changed", labels=CHILD)
@kopf.on.event("v1", "services", id="service-changed", labels=CHILD)
@kopf.on.event("v1", "persistentvolumeclaims", id="claim-changed", labels=CHILD)
@kopf.on.event("v1", "pods", id="pod-changed", labels=CHILD)
def child_changed(namespace: str, labels: dict[str, str], memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.reconcile(namespace, labels[SELECTOR_LABEL])
