"""The cpu engine really runs where Pod Security `restricted` is enforced: admitted, serving the real
model, as the non-root user on a read-only root with its caches on volumes, its admin routes off."""

from __future__ import annotations

import json

import httpx

from tests.helpers.node_view import NodeView, cpu_server

NAME = "restricted"
# Read inside a container: PID 1's user, group, capabilities and no_new_privs, then whether the
# root filesystem, HOME and the hub cache take a file.
PROBE = (
    "grep -E '^(Uid|Gid|CapEff|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' '; "
    "for d in / /root /root/.cache/huggingface /tmp; do "
    "if touch $d/.probe 2>/dev/null; then rm $d/.probe; echo $d writable; else echo $d read-only; fi; done"
)
# The engine's own answer on 127.0.0.1, from the sidecar's container: whatever the sidecar lets through.
ENGINE_GET = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n    print(urllib.request.urlopen('http://127.0.0.1:8081' + sys.argv[1], timeout=10).status)\n"
    "except urllib.error.HTTPError as error:\n    print(error.code)\n"
)


def test_cpu_engine_serves_in_a_restricted_namespace(node: NodeView) -> None:
    node.cluster.kubectl("label", "namespace", node.namespace, "pod-security.kubernetes.io/enforce=restricted")
    node.apply(cpu_server(NAME, public=True))
    node.wait_phase(NAME, "Ready")
    assert not [
        e["message"]
        for e in json.loads(node.kubectl("get", "events", "-o", "json").stdout)["items"]
        if e["reason"] == "FailedCreate"
    ]

    reply = httpx.post(
        f"http://{node.cluster_ip(NAME)}/v1/chat/completions",
        timeout=120,
        json={"model": NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]

    pod = node.ready_pods(NAME)[0]["metadata"]["name"]

    def run_in(container: str, *command: str) -> str:
        # -n before the command: NodeView.kubectl would append it after `--`, into the command.
        return node.cluster.kubectl("exec", "-n", node.namespace, pod, "-c", container, "--", *command).stdout

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
