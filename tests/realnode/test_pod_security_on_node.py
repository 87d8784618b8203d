"""The engines really run where Pod Security `restricted` is enforced: admitted, serving, as the
non-root user with their caches on volumes. The cpu engine on a read-only root, its admin routes
off; the vLLM example (vLLM's CPU build in the stand-in image, with the official image's layout) on a
root filesystem left to root (engines/base.py says why), which vLLM writes nothing to. A gated model
held on the node goes only to pods whose token the hub accepts."""

from __future__ import annotations

import json
import time

import httpx

from modelserve.operator.starts import fetch_result
from modelserve_sandbox.cluster import SMOLLM2_GATED_REPO
from tests.helpers.node_view import VLLM_READY_SECONDS, NodeView, cpu_server, image_writes, vllm_example

NAME = "restricted"
# Read inside a container: PID 1's user, group, capabilities and no_new_privs, then whether the
# root filesystem, HOME and the hub cache take a file.
PROBE = (
    "grep -E '^(Uid|Gid|CapEff|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' '; "
    "for d in / /root /root/.cache/huggingface /tmp; do "
    "if touch $d/.probe 2>/dev/null; then rm $d/.probe; echo $d writable; else echo $d read-only; fi; done"
)
# The vLLM engine's view: as PROBE (saying "not writable": the root filesystem may be writable to root),
# also ~/.cache and the image's WORKDIR, then how the runtime mounted the root filesystem (rw or ro).
VLLM_PROBE = (
    "grep -E '^(Uid|Gid|CapEff|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' '; "
    "for d in / /vllm-workspace /root /root/.cache /root/.cache/huggingface /tmp; do "
    "if touch $d/.probe 2>/dev/null; then rm $d/.probe; echo $d writable; else echo $d not writable; fi; done; "
    'awk \'$5 == "/" {split($6, o, ","); print "root mounted", o[1]}\' /proc/1/mountinfo'
)
# The engine's own answer on 127.0.0.1, from the sidecar's container: whatever the sidecar lets through.
ENGINE_GET = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n    print(urllib.request.urlopen('http://127.0.0.1:8081' + sys.argv[1], timeout=10).status)\n"
    "except urllib.error.HTTPError as error:\n    print(error.code)\n"
)


def _restricted(node: NodeView) -> None:
    node.cluster.kubectl("label", "namespace", node.namespace, "pod-security.kubernetes.io/enforce=restricted")


def _failed_creates(node: NodeView) -> list[str]:
    events = json.loads(node.kubectl("get", "events", "-o", "json").stdout)["items"]
    return [e["message"] for e in events if e["reason"] == "FailedCreate"]


def _run_in(node: NodeView, pod: str, container: str, *command: str) -> str:
    # -n before the command: NodeView.kubectl would append it after `--`, into the command.
    return node.cluster.kubectl("exec", "-n", node.namespace, pod, "-c", container, "--", *command).stdout


def test_cpu_engine_serves_in_a_restricted_namespace(node: NodeView) -> None:
    _restricted(node)
    node.apply(cpu_server(NAME, public=True))
    node.wait_phase(NAME, "Ready")
    assert not _failed_creates(node)

    reply = httpx.post(
        f"http://{node.cluster_ip(NAME)}/v1/chat/completions",
        timeout=120,
        json={"model": NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]

    pod = node.ready_pods(NAME)[0]["metadata"]["name"]

    def run_in(container: str, *command: str) -> str:
        return _run_in(node, pod, container, *command)

    seen = run_in("engine", "sh", "-c", PROBE).splitlines()
    assert seen[:4] == [
        "Uid: 65532 65532 65532 65532",
        "Gid: 65532 65532 65532 65532",
        "CapEff: 0000000000000000",
        "NoNewPrivs: 1",
    ], seen
    assert seen[4:] == [
        "/ read-only",
        "/root writable",
        "/root/.cache/huggingface writable",
        "/tmp writable",
    ], seen
    # The model came down into the hub cache volume, owned by the engine's user.
    find = ["find", "/root/.cache/huggingface", "-type", "f", "-user", "65532", "-path", "*SmolLM2*"]
    assert run_in("engine", *find).strip()

    def engine_status(path: str) -> str:
        return run_in("sidecar", "python", "-c", ENGINE_GET, path).strip()

    assert engine_status("/health") == "200"
    assert engine_status("/slots") == "501"  # --no-slots
    assert engine_status("/") == "404"  # --no-webui


def test_vllm_example_serves_in_a_restricted_namespace(node: NodeView) -> None:
    _restricted(node)
    manifest = vllm_example()  # the example as it is: a private ModelServer, its key generated
    name, model = manifest["metadata"]["name"], manifest["spec"]["model"]
    applied = time.monotonic()
    node.apply(manifest)
    node.wait_phase(name, "Ready", VLLM_READY_SECONDS)
    print(f"\n{name}: apply -> Ready in a restricted namespace: {time.monotonic() - applied:.1f} s")
    assert not _failed_creates(node)

    key = node.secret_value(f"{name}-api-keys", "api-key")
    reply = httpx.post(
        f"http://{node.cluster_ip(name)}/v1/chat/completions",
        timeout=120,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": name, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0  # non-root changes nothing it says

    pod = node.ready_pods(name)[0]
    seen = _run_in(node, pod["metadata"]["name"], "engine", "sh", "-c", VLLM_PROBE).splitlines()
    assert seen[:4] == [
        "Uid: 65532 65532 65532 65532",
        "Gid: 65532 65532 65532 65532",
        "CapEff: 0000000000000000",
        "NoNewPrivs: 1",
    ], seen
    # The image's root user owns its filesystem and WORKDIR: vLLM's user writes to the volumes alone.
    assert seen[4:] == [
        "/ not writable",
        "/vllm-workspace not writable",
        "/root writable",
        "/root/.cache writable",
        "/root/.cache/huggingface writable",
        "/tmp writable",
        "root mounted rw",  # for the NVIDIA toolkit's hooks on GPU nodes, not for vLLM
    ], seen

    def found(*find: str) -> str:
        return _run_in(node, pod["metadata"]["name"], "engine", "find", *find, "-user", "65532").strip()

    # The model came down into the hub cache; vLLM's own cache went to ~/.cache's volume; torch named
    # its compile cache in /tmp after USER (the UID has no account).
    assert found("/root/.cache/huggingface", "-type", "f", "-path", f"*models--{model.replace('/', '--')}*")
    assert found("/root/.cache/vllm", "-type", "f")
    assert found("/tmp", "-maxdepth", "1", "-name", "torchinductor_modelserve")
    # Serving wrote nothing to the image's filesystem either: a read-only root would do for vLLM itself.
    assert image_writes(node.cluster, pod) == {"engine": [], "sidecar": []}


def test_a_gated_model_on_the_node_goes_only_to_pods_whose_token_the_hub_accepts(node: NodeView) -> None:
    """The hub's gated copy of SmolLM2: a pod with a granted token starts (the node's cache then holds
    the file); one with another token, and one with none, are refused by the hub's own check, which
    the node's cache asks before it serves a byte: they never start, and say why."""
    _restricted(node)
    cluster = node.cluster
    model = f"{SMOLLM2_GATED_REPO}:Q4_1"
    for secret, token in (("granted", cluster.gated_token), ("other", "hf_" + "0" * 40)):
        node.kubectl("create", "secret", "generic", secret, f"--from-literal=token={token}")
    node.apply(cpu_server("gated", public=True, model=model, hfTokenSecretRef={"name": "granted"}))
    node.wait_phase("gated", "Ready")
    (pod,) = node.ready_pods("gated")
    assert fetch_result(pod) is not None
    for name, spec in (("refused", {"hfTokenSecretRef": {"name": "other"}}), ("anonymous", {})):
        node.apply(cpu_server(name, public=True, model=model, **spec))
    for name, status in (("refused", "403"), ("anonymous", "401")):
        condition = node.wait_reason(name, "Degraded", "True", "FetchFailed", timeout=180)
        assert f"answered {status}" in condition["message"], condition
        assert not node.ready_pods(name)
    assert not _failed_creates(node)
    # The refused pods restart their fetch with a backoff: gone before the next test (or the node's stop).
    node.kubectl("delete", "modelserver", "refused", "anonymous", "--wait=false")
    node.wait(lambda: not node.pods("refused") and not node.pods("anonymous"), "the refused pods gone", 120)
