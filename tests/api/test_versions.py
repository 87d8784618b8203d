"""Images kept through an operator upgrade (api/versions.py), from plain manifests: the workload the
old operator made is the `live` one the new operator renders against."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from harness.testdata import model_server
from modelserve.api import manifests, versions
from modelserve.contracts.operator_settings import Settings

OLD = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
NEW = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.2.0", engine_images={"vllm": "vllm/vllm-openai:v9.9.9"})


def _images(workload: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["image"] for c in manifests.serving_pod_template(workload)["spec"]["containers"]}


def test_a_new_modelserver_gets_the_operators_images() -> None:
    workload = manifests.workload(model_server(), NEW)
    assert _images(workload) == {"engine": "vllm/vllm-openai:v9.9.9", "sidecar": NEW.sidecar_image}
    recorded = json.loads(workload["metadata"]["annotations"][versions.VERSIONS_ANNOTATION])
    assert recorded == {
        "sidecar": NEW.sidecar_image,
        "engine": "vllm/vllm-openai:v9.9.9",
        "sidecarWorkers": 4,
        "nodeCache": False,
    }


def test_an_operator_upgrade_leaves_the_pod_template_byte_identical_and_reports_the_upgrade() -> None:
    ms = model_server()
    live = manifests.workload(ms, OLD)
    after = manifests.workload(ms, NEW, live=live)
    assert after["spec"]["template"] == live["spec"]["template"]  # nothing rolls
    current, used, _ = manifests.image_versions(ms, NEW, live)
    assert used.sidecar == OLD.sidecar_image and used.engine != "vllm/vllm-openai:v9.9.9"
    upgrade = versions.upgrade(current, used)
    assert (upgrade.available, upgrade.sidecar, upgrade.engine) == ("Yes", NEW.sidecar_image, "vllm/vllm-openai:v9.9.9")
    assert versions.upgrade(current, current).available == "No"


def test_a_workload_made_before_the_annotation_keeps_the_images_its_containers_run() -> None:
    ms = model_server()
    live = manifests.workload(ms, OLD)
    del live["metadata"]["annotations"]
    assert manifests.workload(ms, NEW, live=live)["spec"]["template"] == live["spec"]["template"]


def _workers(workload: dict[str, Any]) -> str | None:
    sidecar = next(c for c in manifests.serving_pod_template(workload)["spec"]["containers"] if c["name"] == "sidecar")
    return next((v["value"] for v in sidecar["env"] if v["name"] == versions.WORKERS_VARIABLE), None)


@pytest.mark.parametrize("annotated", [True, False], ids=["annotation-without-workers", "no-annotation"])
def test_pods_made_before_a_default_of_sidecar_workers_keep_theirs_until_they_roll_anyway(annotated: bool) -> None:
    """An operator that rendered one worker for every unset spec.sidecar.workers made this low-latency
    workload: the new default (4) would roll its GPU pods, so they keep one until they roll anyway."""
    live = manifests.workload(model_server(profile="low-latency", sidecar={"workers": 1}), OLD)
    annotations = live["metadata"]["annotations"]
    if annotated:  # what that operator recorded: the images alone
        recorded = json.loads(annotations[versions.VERSIONS_ANNOTATION])
        annotations[versions.VERSIONS_ANNOTATION] = json.dumps(
            {"sidecar": recorded["sidecar"], "engine": recorded["engine"]}
        )
    else:
        del live["metadata"]["annotations"]
    ms = model_server(profile="low-latency")
    after = manifests.workload(ms, NEW, live=live)
    assert after["spec"]["template"] == live["spec"]["template"] and _workers(after) is None
    current, used, _ = manifests.image_versions(ms, NEW, live)
    assert (current.sidecar_workers, used.sidecar_workers) == (4, 1)
    upgrade = versions.upgrade(current, used)
    assert upgrade.available == "Yes" and upgrade.sidecar_workers == 4
    # A spec change rolls the pods: they take the default with it (with no recorded hash, as the
    # images, at the first change after this operator recorded one).
    rolled = manifests.workload(model_server(profile="low-latency", maxModelLen=4096), NEW, live=live)
    if not annotated:
        rolled = manifests.workload(model_server(profile="low-latency", maxModelLen=8192), NEW, live=rolled)
    assert _workers(rolled) == "4"


def test_sidecar_workers_named_in_the_spec_are_rendered_at_once() -> None:
    live = manifests.workload(model_server(profile="low-latency"), OLD)
    assert _workers(live) == "4"
    after = manifests.workload(model_server(profile="low-latency", sidecar={"workers": 2}), OLD, live=live)
    assert _workers(after) == "2"
    again = manifests.workload(model_server(profile="low-latency", sidecar={"workers": 2}), NEW, live=after)
    assert again["spec"]["template"]["spec"]["containers"] == after["spec"]["template"]["spec"]["containers"]


@pytest.mark.parametrize(
    "change",
    [{"maxModelLen": 4096}, {"image": "my/vllm:custom"}, {"upgradePolicy": "Automatic"}],
    ids=["spec-change-rolls-anyway", "own-image", "automatic"],
)
def test_the_new_images_come_when_the_pods_roll_anyway_or_the_owner_opts_in(change: dict[str, Any]) -> None:
    live = manifests.workload(model_server(), OLD)
    after = manifests.workload(model_server(**change), NEW, live=live)
    assert _images(after)["sidecar"] == NEW.sidecar_image
    assert _images(after)["engine"] == change.get("image", "vllm/vllm-openai:v9.9.9")


@pytest.mark.parametrize(
    "change",
    [{"replicas": {"min": 2, "max": 4}}, {"rolloutStrategy": "Replace"}, {"upgradePolicy": "Manual"}],
    ids=["replicas", "rollout-strategy", "manual"],
)
def test_changes_that_do_not_touch_the_pods_keep_the_images(change: dict[str, Any]) -> None:
    live = manifests.workload(model_server(), OLD)
    after = manifests.workload(model_server(**change), NEW, live=live)
    assert after["spec"]["template"] == live["spec"]["template"]


def test_once_pinned_later_reconciles_keep_the_pinned_images() -> None:
    ms = model_server()
    applied = manifests.workload(ms, NEW, live=manifests.workload(ms, OLD))
    again = manifests.workload(ms, NEW, live=copy.deepcopy(applied))
    assert again == applied


def test_a_multi_node_group_keeps_the_images_of_leaders_and_workers() -> None:
    ms = model_server(gpus=16, nodes=2)
    live = manifests.workload(ms, OLD)
    after = manifests.workload(ms, NEW, live=live)
    assert manifests.pod_templates(after) == manifests.pod_templates(live)


def test_rollout_strategy_surge_or_replace() -> None:
    surge = manifests.workload(model_server(), NEW)["spec"]["strategy"]["rollingUpdate"]
    replace = manifests.workload(model_server(rolloutStrategy="Replace"), NEW)["spec"]["strategy"]["rollingUpdate"]
    assert (surge, replace) == ({"maxSurge": 1, "maxUnavailable": 0}, {"maxSurge": 0, "maxUnavailable": 1})
    group = manifests.workload(model_server(gpus=16, nodes=2, rolloutStrategy="Replace"), NEW)
    assert group["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1}


CACHED = dataclasses.replace(OLD, node_cache_url="http://modelserve-nodecache.modelserve.svc.cluster.local:8090")


def _fetches(workload: dict[str, Any]) -> bool:
    return "initContainers" in manifests.serving_pod_template(workload)["spec"]


@pytest.mark.parametrize("annotated", [True, False], ids=["annotation-without-node-cache", "no-annotation"])
def test_pods_made_before_the_node_cache_keep_starting_without_it_until_they_roll_anyway(annotated: bool) -> None:
    """An operator without the node cache made this workload; one with it leaves its pods alone (a new
    init container would roll them) and says the node cache is kept back, until the spec changes."""
    ms = model_server()
    live = manifests.workload(ms, OLD)
    annotations = live["metadata"]["annotations"]
    if annotated:  # what an operator before the node cache recorded
        recorded = json.loads(annotations[versions.VERSIONS_ANNOTATION])
        del recorded["nodeCache"]
        annotations[versions.VERSIONS_ANNOTATION] = json.dumps(recorded)
    else:
        del live["metadata"]["annotations"]
    after = manifests.workload(ms, CACHED, live=live)
    assert after["spec"]["template"] == live["spec"]["template"] and not _fetches(after)
    current, used, _ = manifests.image_versions(ms, CACHED, live)
    assert (current.node_cache, used.node_cache) == (True, False)
    upgrade = versions.upgrade(current, used)
    assert upgrade.available == "Yes" and upgrade.node_cache is True
    assert upgrade.message.startswith("the node's model cache is kept back")
    rolled = manifests.workload(model_server(maxModelLen=4096), CACHED, live=after)
    if not annotated:  # no recorded hash: the first change records one, the next rolls
        rolled = manifests.workload(model_server(maxModelLen=8192), CACHED, live=rolled)
    assert _fetches(rolled)


def test_the_owner_moves_a_modelserver_onto_the_node_cache_on_purpose() -> None:
    live = manifests.workload(model_server(), OLD)
    assert _fetches(manifests.workload(model_server(cache={"node": True}), CACHED, live=live))
    assert _fetches(manifests.workload(model_server(upgradePolicy="Automatic"), CACHED, live=live))
    # And off it: the pods roll without the fetch.
    on = manifests.workload(model_server(), CACHED)
    assert _fetches(on)
    assert not _fetches(manifests.workload(model_server(cache={"node": False}), CACHED, live=on))
