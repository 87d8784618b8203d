"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Every replica campaigns; one holds the Lease and renews it every `retry` seconds. Expiry is judged
on the candidate's own clock (how long the Lease has not changed since it first saw this version),
never by comparing renewTime with its clock, so skew between nodes does not matter. A leader that
cannot renew for `renew_deadline` (shorter than the lease) stops leading before anyone may take
over; one that shuts down empties the holder, so a standby takes over at its next try.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from .apply import Kube

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
LEASE_KIND = "Lease"


@dataclass(frozen=True)
class Timing:
    duration: float = 15.0  # a holder silent this long is gone (leaseDurationSeconds)
    renew_deadline: float = 10.0  # a leader that could not renew this long steps down
    retry: float = 2.0  # between tries, leader and candidates alike

    @classmethod
    def for_lease(cls, seconds: float) -> Timing:
        """client-go's proportions (15 / 10 / 2) for another lease duration."""
        return cls(seconds, seconds * 2 / 3, seconds * 2 / 15)


def micro_time(at: datetime) -> str:
    """A MicroTime as the API server writes it."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claimed(
    lease: dict[str, Any] | None, namespace: str, name: str, identity: str, duration: float, now: datetime
) -> dict[str, Any]:
    """The Lease written to hold it: renewed when `identity` holds it, else taken over (a transition)."""
    spec = dict((lease or {}).get("spec") or {})
    metadata = {"name": name, "namespace": namespace}
    if lease is not None:
        metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]  # optimistic concurrency
    if spec.get("holderIdentity") != identity:
        spec["acquireTime"] = micro_time(now)
        spec["leaseTransitions"] = spec.get("leaseTransitions", -1) + 1 if lease else 0
    spec.update(holderIdentity=identity, leaseDurationSeconds=max(1, round(duration)), renewTime=micro_time(now))
    return {"apiVersion": LEASE_API_VERSION, "kind": LEASE_KIND, "metadata": metadata, "spec": spec}


def held_by_another(lease: dict[str, Any] | None, identity: str, unchanged_for: float) -> bool:
    """Whether someone else holds the Lease: a holder is named and the Lease changed (was renewed)
    within its duration, as this candidate's clock saw it."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return False
    return unchanged_for < spec.get("leaseDurationSeconds", 15)


class Elector:
    """One replica's campaign for the Lease `namespace/name`."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing = Timing(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.timing = timing
        self.clock = clock
        self._seen: tuple[str, float] | None = None  # (resourceVersion, when first seen)

    def try_hold(self) -> bool:
        """One try to take or renew the Lease; True when this replica holds it now."""
        lease = self.kube.get(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name)
        now = self.clock()
        if lease is not None:
            version = lease["metadata"]["resourceVersion"]
            if self._seen is None or self._seen[0] != version:
                self._seen = (version, now)
            if held_by_another(lease, self.identity, now - self._seen[1]):
                return False
        body = claimed(lease, self.namespace, self.name, self.identity, self.timing.duration, datetime.now(UTC))
        try:
            written = self.kube.create_returning(body) if lease is None else self.kube.update(body)
        except ApiException as error:
            if error.status == 409:  # another replica wrote first
                return False
            raise
        self._seen = (written["metadata"]["resourceVersion"], self.clock())
        return True

    def _safe_try(self) -> bool:
        try:
            return self.try_hold()
        except (ApiException, OSError) as error:  # the API server unreachable: try again later
            log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            return False

    def campaign(self, stop: threading.Event) -> bool:
        """Block until this replica leads (True) or `stop` is set (False)."""
        log.info("lease %s/%s: campaigning as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if self._safe_try():
                log.info("lease %s/%s: leading as %s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self.timing.retry)
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until `stop` (then release the Lease); `on_lost` when renewing failed for the renew
        deadline or another replica holds it."""
        renewed = self.clock()
        while not stop.wait(self.timing.retry):
            if self._safe_try():
                renewed = self.clock()
            elif self.clock() - renewed >= self.timing.renew_deadline or self._lost_to_another():
                log.error("lease %s/%s: no longer leading", self.namespace, self.name)
                on_lost()
                return
        self.release()

    def _lost_to_another(self) -> bool:
        try:
            lease = self.kube.get(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name)
        except (ApiException, OSError):
            return False
        return ((lease or {}).get("spec") or {}).get("holderIdentity") not in (None, self.identity)

    def release(self) -> None:
        """Empty the holder (when still ours), so a standby need not wait out the lease."""
        try:
            lease = self.kube.get(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
            self.kube.update({**lease, "spec": spec})
            log.info("lease %s/%s: released", self.namespace, self.name)
        except (ApiException, OSError) as error:
            log.warning("lease %s/%s: not released: %s", self.namespace, self.name, error)
