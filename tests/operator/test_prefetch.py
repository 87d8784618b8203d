"""spec.cache.prefetch as a pure plan: a fetch Job for each selected node whose node cache does not
hold the model, the nodes' state, and the Prefetched condition (operator/prefetch.py)."""

from __future__ import annotations

from typing import Any

from harness.testdata import model_server
from modelserve.api import manifests
from modelserve.contracts.nodecache import FetchSettings, node_label
from modelserve.contracts.operator_settings import Settings
from modelserve.operator.prefetch import plan

SETTINGS = Settings(node_cache_url="http://agent.ns.svc:8090")
MS = model_server(
    cache={"prefetch": {"nodeSelector": {"pool": "gpu"}}}, tolerations=[{"key": "t", "operator": "Exists"}]
)


def _node(name: str, holds: bool = False, pool: str = "gpu") -> dict[str, Any]:
    labels = {"pool": pool, **({node_label(MS.spec.model): "true"} if holds else {})}
    return {"metadata": {"name": name, "labels": labels}}


def _job(node: str, failed: bool = False) -> dict[str, Any]:
    job = manifests.prefetch_job(MS, SETTINGS, node)
    if failed:
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}
    return job


def test_a_job_per_selected_node_that_does_not_hold_the_model() -> None:
    planned = plan(MS, SETTINGS, [_node("a", holds=True), _node("b"), _node("c", pool="cpu")], [])
    (job,) = planned.jobs
    assert job["metadata"]["name"] == manifests.prefetch_job_name(MS, "b")
    pod = job["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]
    (fetch,) = pod["containers"]
    settings = FetchSettings.from_env({v["name"]: v["value"] for v in fetch["env"] if "value" in v})
    assert settings.warm_only and settings.node_cache == SETTINGS.node_cache_url and "volumeMounts" not in fetch
    assert pod["automountServiceAccountToken"] is False
    assert {"key": "t", "operator": "Exists"} in pod["tolerations"] and {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    # Not one of the ModelServer's pods: they carry no selector label.
    assert "serving.modelserve.dev/modelserver" not in job["spec"]["template"]["metadata"]["labels"]
    assert planned.status.warm == "1/2"
    assert [(n.node, n.state) for n in planned.status.nodes] == [("a", "Held"), ("b", "Fetching")]
    assert planned.condition[:2] == (False, "Fetching")


def test_every_node_holding_it_is_the_condition_met() -> None:
    planned = plan(MS, SETTINGS, [_node("a", holds=True), _node("b", holds=True)], [_job("b")])
    assert planned.jobs == [] and planned.condition[:2] == (True, "Held") and planned.status.warm == "2/2"


def test_a_failed_job_and_a_selector_matching_nothing_say_why() -> None:
    failed = plan(MS, SETTINGS, [_node("a")], [_job("a", failed=True)])
    assert failed.jobs == [] and failed.condition[:2] == (False, "PrefetchFailed")
    assert "BackoffLimitExceeded" in failed.status.nodes[0].message
    nothing = plan(MS, SETTINGS, [_node("a", pool="cpu")], [])
    assert nothing.condition == (False, "NoNodeSelected", "spec.cache.prefetch.nodeSelector pool=gpu matches no node")
    assert nothing.status.warm == "0/0"
