"""The node agent's questions to a real API server, asked with the chart's own RBAC (its ServiceAccount,
ClusterRole and binding, rendered by helm): which models the pods on its node use.

Issue 57 L7: any pod's `cache.serving.modelserve.dev/model` label pinned any model on its node (a
tenant filled a node's cache with pins), and the LoRA adapters a model pod uses were never in use. A
pin now counts where the pod's ModelServer, in its namespace, names that model; its hub adapters
count with it.

Each test has a KWOK node of its own, tainted so the scheduler puts no other test's pod there: the
agent's answer is about exactly the pods a test binds to it (spec.nodeName; KWOK runs them, whatever
their image)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from modelserve.contracts.names import API_VERSION, KIND, SELECTOR_LABEL
from modelserve.contracts.nodecache import POD_MODEL_LABEL, model_key
from modelserve.nodecache.hub import RAW_BYTES
from modelserve.nodecache.node import NodeApi
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.nodes import KWOK_ANNOTATION
from modelserve_sandbox.processes import wait_until
from tests.helpers.chart import CHART

MODEL, ADAPTER, OTHER = "LiquidAI/LFM2-1.2B", "acme/pirate-lora", "acme/other-model"
# The agent's RBAC as the chart grants it, and nothing else of the chart.
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: Path
    token: str

    def ask(self, node: str) -> set[str] | None:
        """models_in_use, as the agent asks it (its session's headers included)."""

        async def run() -> set[str] | None:
            async with aiohttp.ClientSession(headers=RAW_BYTES, auto_decompress=False) as session:
                return await NodeApi(node, session, self.server, lambda: self.token, self.ca_file).models_in_use()

        return asyncio.run(run())


def _credentials(cluster: Cluster, namespace: str, account: str) -> Credentials:
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    (entry,) = json.loads(cluster.kubeconfig.read_text())["clusters"]
    return Credentials(cluster.server, Path(entry["cluster"]["certificate-authority"]), token)


@pytest.fixture(scope="module")
def agent_rbac(cluster: Cluster) -> Iterator[tuple[str, str, str]]:
    """The chart's node agent RBAC in a namespace of its own: (namespace, ServiceAccount, ClusterRole)."""
    namespace, release = f"l7-agent-{uuid.uuid4().hex[:6]}", f"l7{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    rendered = cluster.helm(
        "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.33.0",
        "--show-only", "templates/nodecache.yaml",
    ).stdout  # fmt: skip
    objects = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
    assert sorted(d["kind"] for d in objects) == sorted(RBAC_KINDS)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    names = {d["kind"]: d["metadata"]["name"] for d in objects}
    _wait_granted(cluster, namespace, names["ServiceAccount"], "get", "modelservers.serving.modelserve.dev")
    yield namespace, names["ServiceAccount"], names["ClusterRole"]
    for kind in ("ClusterRoleBinding", "ClusterRole"):
        cluster.kubectl("delete", kind, names[kind], "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _wait_granted(cluster: Cluster, namespace: str, account: str, verb: str, resource: str) -> None:
    """Until the API server's authorizer has the new binding (it reads RBAC from a cache)."""
    user = f"--as=system:serviceaccount:{namespace}:{account}"
    wait_until(
        lambda: cluster.kubectl("auth", "can-i", verb, resource, user, check=False).stdout.strip() == "yes",
        30,
        f"{account} allowed to {verb} {resource}",
    )


@pytest.fixture(scope="module")
def agent(cluster: Cluster, agent_rbac: tuple[str, str, str]) -> Credentials:
    namespace, account, _ = agent_rbac
    return _credentials(cluster, namespace, account)


@pytest.fixture
def node(cluster: Cluster) -> Iterator[str]:
    """A KWOK node of this test's own, which the scheduler gives no pod (only pods naming it land)."""
    name = f"l7-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": dict(KWOK_ANNOTATION), "labels": {"type": "kwok"}},
        "spec": {"taints": [{"key": "serving.modelserve.dev/test", "value": "l7", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "20"}},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
    yield name
    cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def _model_server(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": {"model": MODEL, **spec}}


def _pod(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod bound to `node` with these labels: an API object only (KWOK runs it; nothing pulls the image)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.invalid/none:0"}],
        },
    }


def _create(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listed))


def test_only_a_modelservers_own_pin_counts_with_its_hub_adapters(
    cluster: Cluster, crd_installed: None, namespace: str, node: str, agent: Credentials
) -> None:
    adapters = [{"name": "pirate", "source": ADAPTER}, {"name": "poet", "source": "/root/.cache/huggingface/poet"}]
    _create(
        cluster,
        namespace,
        _model_server("base", adapters=adapters),
        # Its replica, as the operator labels it.
        _pod("replica", node, {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(MODEL)}),
        # Any pod's label pinned any model: a model label and no ModelServer.
        _pod("rogue", node, {POD_MODEL_LABEL: model_key("acme/rogue-model")}),
        # The ModelServer's name, another model's key.
        _pod("impostor", node, {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(OTHER)}),
        # A ModelServer that does not exist (its GET is a 404).
        _pod("orphan", node, {SELECTOR_LABEL: "gone", POD_MODEL_LABEL: model_key("acme/orphan-model")}),
    )
    # The adapter given as a path is in the pod's own volume: the node's cache holds no copy.
    assert agent.ask(node) == {model_key(MODEL), model_key(ADAPTER)}


def test_a_pod_of_a_modelserver_that_does_not_exist_pins_nothing(
    cluster: Cluster, crd_installed: None, namespace: str, node: str, agent: Credentials
) -> None:
    _create(cluster, namespace, _pod("orphan", node, {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(MODEL)}))
    # Known to pin nothing (a 404), not unknown (None would keep every model on the node).
    assert agent.ask(node) == set()
    # The same pod's ModelServer in another namespace lends it nothing.
    elsewhere = f"{namespace}-x"
    cluster.create_namespace(elsewhere)
    try:
        _create(cluster, elsewhere, _model_server("base"))
        assert agent.ask(node) == set()
        _create(cluster, namespace, _model_server("base"))
        assert agent.ask(node) == {model_key(MODEL)}
    finally:
        cluster.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)


def test_when_the_api_server_refuses_a_modelserver_every_model_is_kept(
    cluster: Cluster,
    crd_installed: None,
    namespace: str,
    node: str,
    agent_rbac: tuple[str, str, str],
    agent: Credentials,
) -> None:
    """A refusal (403) is not a 404: the agent cannot say what is in use, and keeps everything."""
    _create(
        cluster,
        namespace,
        _model_server("base"),
        _pod("replica", node, {SELECTOR_LABEL: "base", POD_MODEL_LABEL: model_key(MODEL)}),
    )
    assert agent.ask(node) == {model_key(MODEL)}
    # An account that may list pods but not get ModelServers: the pods' ModelServers stay unknown.
    account = "pods-only"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    role = f"l7-pods-only-{namespace}"
    cluster.kubectl("create", "clusterrole", role, "--verb=list", "--resource=pods")
    try:
        cluster.kubectl(
            "create", "clusterrolebinding", role, f"--clusterrole={role}", f"--serviceaccount={namespace}:{account}"
        )
        _wait_granted(cluster, namespace, account, "list", "pods")
        assert _credentials(cluster, namespace, account).ask(node) is None
    finally:
        cluster.kubectl("delete", "clusterrolebinding", role, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterrole", role, "--wait=false", check=False)
    # And one that may do neither (the namespace's default account).
    assert _credentials(cluster, namespace, "default").ask(node) is None
