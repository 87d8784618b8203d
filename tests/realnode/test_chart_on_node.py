"""The chart as a user installs it on their own cluster: the images and the chart pushed to a private
registry (`make push`), `helm install oci://...` from it, and every pod pulling its images from it
with an imagePullSecret's credentials, over the network (the sandbox's registry, modelserve_sandbox.
registry). Then the chart's operator as a real pod on the real node: its ServiceAccount, the API server
through the `kubernetes` Service, and a ModelServer it serves, whose pod fetches its model through the
chart's node cache (the DaemonSet's agent on this node) and answers the openai SDK."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import openai

from modelserve import __version__
from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.llama_server import LLAMA_BUILD
from modelserve_sandbox.registry import Registry, private_registry
from tests.helpers.node_view import NodeView, cpu_server

ROOT = Path(__file__).resolve().parents[2]
PULL_SECRET = "registry-credentials"


def _push(registry: Registry, login: Path, repository: str) -> float:
    """`make push` to the registry (the modelserve image, the sandbox's llama.cpp build and the chart)
    as a user runs it, with a `docker login`'s config; its seconds."""
    start = time.monotonic()
    env = {
        **os.environ,
        "REGISTRY": repository,
        "PLAIN_HTTP": "1",
        "PUSH_IMAGES": "llama.cpp",
        "DOCKER_CONFIG": str(login.parent),
        "HELM_REGISTRY_CONFIG": str(login),
    }
    push = subprocess.run(
        ["make", "--no-print-directory", "push"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert push.returncode == 0, push.stdout + push.stderr
    assert f"pushed chart oci://{repository}/charts/modelserve, version {__version__}" in push.stdout, push.stdout
    return time.monotonic() - start


def _pull_secret(registry: Registry, namespace: str) -> dict:
    """The `kubernetes.io/dockerconfigjson` Secret `kubectl create secret docker-registry` makes."""
    config = base64.b64encode(json.dumps(registry.docker_config()).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PULL_SECRET, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": config},
    }


def _crane(node_cluster: Cluster, login: Path, *args: str) -> str:
    """crane (built beside the registry) with the login's credentials; its standard output."""
    ran = subprocess.run(
        [str(node_cluster.bin_dir / "crane"), "--insecure", *args],
        env={**os.environ, "DOCKER_CONFIG": str(login.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def _with_a_layer_of_its_own(node_cluster: Cluster, login: Path, image: str, tag: str, workdir: Path) -> str:
    """`image` plus one small layer no node holds (a file naming this run), pushed as `tag`; the new
    layer's digest. containerd shares layers by digest, and every other layer of our images is in the
    node's store already (the sandbox imports the same builds): a pod of `tag` makes the node fetch
    this one from the registry, so the pull is seen to cross the network."""
    marker = workdir / f"{tag.rsplit(':', 1)[-1]}.marker"
    marker.write_text(f"pulled from the sandbox's registry by {uuid.uuid4()}\n")
    layer = marker.with_suffix(".tar")
    with tarfile.open(layer, "w") as archive:
        archive.add(marker, arcname="etc/modelserve-registry-test")
    _crane(node_cluster, login, "append", "-b", image, "-f", str(layer), "-t", tag)
    return json.loads(_crane(node_cluster, login, "manifest", tag))["layers"][-1]["digest"]


def _images(pod: dict) -> list[str]:
    return [c["image"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]]


def test_chart_from_a_private_registry_runs_its_operator_as_a_pod_and_serves_a_model(
    node_cluster: Cluster, tmp_path: Path
) -> None:
    release, system, apps = "modelserve", f"ms-system-{uuid.uuid4().hex[:6]}", f"apps-{uuid.uuid4().hex[:6]}"
    with private_registry(
        node_cluster.bin_dir, tmp_path / "registry", node_cluster.log_dir, node_cluster.registry_hosts
    ) as registry:
        repository = f"{registry.address}/modelserve"
        login = tmp_path / "docker" / "config.json"
        login.parent.mkdir()
        login.write_text(json.dumps(registry.docker_config()))
        pushed = _push(registry, login, repository)
        # Nothing is served without the credentials (the registry's own refusal).
        anonymous = subprocess.run(
            [str(node_cluster.bin_dir / "crane"), "--insecure", "manifest", f"{repository}/modelserve:{__version__}"],
            env={**os.environ, "DOCKER_CONFIG": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert anonymous.returncode != 0 and "UNAUTHORIZED" in anonymous.stderr, anonymous.stderr
        for namespace in (system, apps):
            node_cluster.create_namespace(namespace)
        node_cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
                _pull_secret(registry, system), _pull_secret(registry, apps)
            ]})
        )  # fmt: skip
        run = uuid.uuid4().hex[:8]
        modelserve_image = f"{repository}/modelserve:{__version__}-{run}"
        llama_image = f"{repository}/llama.cpp:server-b{LLAMA_BUILD}-{run}"
        own_layers = {
            "modelserve": _with_a_layer_of_its_own(
                node_cluster, login, f"{repository}/modelserve:{__version__}", modelserve_image, tmp_path
            ),
            "llama.cpp": _with_a_layer_of_its_own(
                node_cluster, login, f"{repository}/llama.cpp:server-b{LLAMA_BUILD}", llama_image, tmp_path
            ),
        }
        installed = time.monotonic()
        node_cluster.helm(
            "install",
            release,
            f"oci://{repository}/charts/modelserve",
            "--version",
            __version__,
            "--plain-http",
            "--registry-config",
            str(login),
            "--namespace",
            system,
            "--set",
            "crds.enabled=false",  # the sandbox applies the CRD itself, for every release of the run
            "--set",
            f"image.repository={repository}/modelserve",
            "--set",
            f"image.tag={__version__}-{run}",
            "--set",
            f"imagePullSecrets[0].name={PULL_SECRET}",
            "--set",
            f"modelPods.imagePullSecrets[0].name={PULL_SECRET}",
            "--set",
            f"engines.llamacpp.image={llama_image}",
            "--set",
            f"hub.endpoint={node_cluster.hub_endpoint}",
            "--set",
            f"nodeCache.hostPath={node_cluster.workdir / 'node' / f'model-cache-{release}'}",
            "--wait",
            "--timeout",
            "300s",
            timeout=330,
        )
        install_seconds = time.monotonic() - installed
        try:
            pods = json.loads(node_cluster.kubectl("get", "pods", "-n", system, "-o", "json").stdout)["items"]
            by_component = {pod["metadata"]["labels"]["app.kubernetes.io/component"]: pod for pod in pods}
            assert sorted(by_component) == ["gateway", "nodecache", "operator"]
            assert all(pod["spec"]["nodeName"] == realnode.NODE_NAME for pod in pods)
            assert by_component["operator"]["spec"]["serviceAccountName"] == release
            assert by_component["gateway"]["spec"]["serviceAccountName"] == f"{release}-gateway"
            for pod in pods:
                assert all(image.startswith(f"{repository}/") for image in _images(pod)), _images(pod)
            view = NodeView(node_cluster, apps, tmp_path / "no-host-operator.log")
            view.apply(cpu_server("from-chart", public=True))
            ready = view.wait_phase("from-chart", "Ready")
            # No operator runs outside the cluster in this module: the pod's operator did this.
            assert ready["status"]["readyReplicas"] == 1
            (pod,) = view.pods("from-chart")
            # The sidecar, the fetch and the engine, from the registry with the chart's default secret.
            assert {PULL_SECRET} == {ref["name"] for ref in pod["spec"]["imagePullSecrets"]}
            assert sorted(set(_images(pod))) == sorted({modelserve_image, llama_image})
            # The chart's agent answered the pod's fetch (no fallback to the hub, which the result would say).
            result = fetch_result(pod)
            assert result is not None and not result.node_cache and result.hub_bytes + result.node_bytes > 0, result
            client = openai.OpenAI(base_url=f"http://{view.cluster_ip('from-chart')}/v1", api_key="none", timeout=120)
            answer = client.chat.completions.create(
                model="from-chart", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
            )
            assert answer.choices[0].message.content, answer
            first_answer = time.monotonic() - installed
            # Pulled over the network with the credentials: the registry served each image's manifest
            # and the layer no node held to its user, and only refused requests without them.
            served = [r for r in registry.journal() if r["method"] == "GET" and r["status"] == 200]
            for name, layer in own_layers.items():
                prefix = f"/v2/modelserve/{name}/"
                assert any(r["path"].startswith(f"{prefix}manifests/") for r in served), registry.journal()
                assert f"{prefix}blobs/{layer}" in {r["path"] for r in served}, (name, layer, registry.journal())
            assert all(r["user"] == registry.user for r in registry.journal() if r["status"] != 401)
            print(
                f"push {pushed:.1f} s, helm install --wait {install_seconds:.1f} s, first answer "
                f"{first_answer:.1f} s after the install began; the model's start: {ready['status']['lastStart']}"
            )
        finally:
            node_cluster.kubectl("delete", "namespace", apps, "--wait=false", check=False)
            node_cluster.kubectl("delete", "pods", "--all", "-n", apps, "--grace-period=1", "--wait=false", check=False)
            node_cluster.helm("uninstall", release, "--namespace", system, "--wait", "--timeout", "120s")
