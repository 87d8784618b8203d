"""spec.cache.prefetch: the nodes it selects, which of them hold the model (their node agent's label),
and a fetch Job for each that does not. Pure: from the cached nodes and Jobs to what to apply and the
status (`plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.api.status import CacheStatus, NodeWarmth
from modelserve.contracts.nodecache import node_label
from modelserve.contracts.operator_settings import Settings

# The Prefetched condition's reasons: (status, what its message says).
REASONS = {
    "Held": (True, "every selected node (<count>) holds the model"),
    "Fetching": (False, "fetching into the node cache of <missing> of <count> nodes"),
    "NoNodeSelected": (False, "spec.cache.prefetch.nodeSelector <selector> matches no node"),
    "PrefetchFailed": (False, "its prefetch Job <name> failed: <why>"),
}


@dataclass(frozen=True)
class Plan:
    jobs: list[dict[str, Any]]  # to apply: one per selected node that does not hold the model
    status: CacheStatus
    condition: tuple[bool, str, str]  # (ok, reason, message) of the Prefetched condition


def selected(nodes: list[dict[str, Any]], selector: dict[str, str]) -> list[dict[str, Any]]:
    return [
        node
        for node in nodes
        if all((node["metadata"].get("labels") or {}).get(key) == value for key, value in selector.items())
    ]


def _job_state(job: dict[str, Any] | None) -> tuple[str, str]:
    """(Fetching or Failed, why) of a node's prefetch Job (none yet: Fetching)."""
    for condition in ((job or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            why = condition.get("message") or condition.get("reason") or "failed"
            return "Failed", f"its prefetch Job {job['metadata']['name']} failed: {why}"
    return "Fetching", ""


def plan(ms: ModelServer, settings: Settings, nodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> Plan:
    """What spec.cache.prefetch asks for now, given the cluster's nodes and the ModelServer's Jobs."""
    assert ms.spec.cache is not None and ms.spec.cache.prefetch is not None
    selector = dict(ms.spec.cache.prefetch.node_selector)
    label = node_label(ms.spec.model)
    chosen = sorted(selected(nodes, selector), key=lambda node: node["metadata"]["name"])
    by_node = {(job["metadata"].get("labels") or {}).get(manifests.PREFETCH_NODE_LABEL): job for job in jobs}
    warmth, wanted = [], []
    for node in chosen:
        name = node["metadata"]["name"]
        if (node["metadata"].get("labels") or {}).get(label) == "true":
            warmth.append(NodeWarmth(node=name, state="Held"))
            continue
        state, why = _job_state(by_node.get(name))
        warmth.append(NodeWarmth(node=name, state=state, message=why or None))
        if state == "Fetching":
            wanted.append(manifests.prefetch_job(ms, settings, name))
    held = sum(1 for node in warmth if node.state == "Held")
    failed = [node.message for node in warmth if node.state == "Failed"]
    if not chosen:
        shown = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        message = f"spec.cache.prefetch.nodeSelector {shown} matches no node"
        condition = (False, "NoNodeSelected", message)
    elif failed:
        message = "; ".join(failed)
        condition = (False, "PrefetchFailed", message)
    elif held < len(chosen):
        message = f"fetching into the node cache of {len(chosen) - held} of {len(chosen)} nodes"
        condition = (False, "Fetching", message)
    else:
        message = ""
        condition = (True, "Held", f"every selected node ({held}) holds the model")
    status = CacheStatus(warm=f"{held}/{len(chosen)}", nodes=warmth, message=message or None)
    return Plan(wanted, status, condition)
