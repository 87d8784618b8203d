"""The gateway as users get it: the chart installs the operator and the gateway as real pods on the
real node (images from our Dockerfile), and the real `openai` SDK reaches two ModelServers — real
sidecars in front of the real llama.cpp engine — through the gateway's one Service.

In order: a model at `min: 0` wakes on its first requests (one stream, one not, both held while
the operator scales it up from the gateway's held count); `GET /v1/models` shows each key what it
opens; llama.cpp's own routes are the sidecar's (or the gateway's) 404 and never reach the engine;
a slow request on one replica sends the next ones to the other; a replica deleted under load loses
no request; an in-cluster client reaches both engines by the names their status advertises.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from harness.certificates import CA, Issued, served_certificate
from modelserve.contracts.sidecar import LISTEN_PORT, serves_tls
from modelserve.engines import llamacpp
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import wait_until
from tests.helpers.gateway_routing import gateway_replicas, routed_beside_long_streams
from tests.helpers.in_cluster import client_calls
from tests.helpers.node_view import (
    GREEDY,
    NO_END,
    PROMPT,
    VLLM_READY_SECONDS,
    NodeView,
    Timeline,
    cpu_server,
    install_chart,
    vllm_example,
)

REPO = Path(__file__).resolve().parents[2]

RELEASE = "modelserve"
GATEWAY = f"{RELEASE}-gateway"
HELLO = [{"role": "user", "content": "Say hello"}]
WAKE_SECONDS_AT_MOST = 240
LOAD_SECONDS = 30
BEFORE_DELETION, AFTER_DELETION = 8, 12  # answers under load on either side of a replica's deletion


@dataclass(frozen=True)
class Installed:
    system: str  # the chart's namespace
    view: NodeView  # the ModelServers' namespace
    base: str  # the gateway's base URL, through its Service (kube-proxy)


@pytest.fixture(scope="module")
def installed(node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    system, apps = f"ms-system-{uuid.uuid4().hex[:6]}", f"apps-{uuid.uuid4().hex[:6]}"
    node_cluster.create_namespace(apps)
    install_chart(node_cluster, RELEASE, system)
    view = NodeView(node_cluster, apps, tmp_path_factory.mktemp("gateway") / "no-host-operator.log")
    try:
        view.apply(cpu_server("alpha", public=True, replicas={"min": 2, "max": 2}))
        beta = {"min": 0, "max": 1, "buffer": 0, "scaleDownDelaySeconds": 600, "idleWindowSeconds": 600}
        view.apply(cpu_server("beta", replicas=beta))
        service = json.loads(node_cluster.kubectl("get", "service", GATEWAY, "-n", system, "-o", "json").stdout)
        yield Installed(system, view, f"http://{service['spec']['clusterIP']}")
    finally:
        node_cluster.kubectl("delete", "namespace", apps, "--wait=false", check=False)
        node_cluster.kubectl("delete", "pods", "--all", "-n", apps, "--grace-period=1", "--wait=false", check=False)
        node_cluster.helm("uninstall", RELEASE, "--namespace", system, "--wait", "--timeout", "120s")
        node_cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)


def _client(base: str, key: str = "none", timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, timeout=timeout, max_retries=0)


def test_a_model_at_zero_wakes_on_its_first_requests(installed: Installed) -> None:
    view = installed.view
    beta = view.wait_phase("beta", "Idle")
    assert beta["status"]["replicas"] == 0 and not view.pods("beta")
    # Every ModelServer names the one endpoint.
    assert beta["status"]["gatewayEndpoint"] == f"http://{GATEWAY}.{installed.system}.svc.cluster.local/v1"
    key = view.secret_value("beta-api-keys", "api-key")
    client = _client(installed.base, key, timeout=WAKE_SECONDS_AT_MOST)
    timeline = Timeline()
    answers: dict[str, str] = {}
    held_seen: list[int] = []

    def ask(streaming: bool) -> None:
        try:
            if streaming:
                stream = client.chat.completions.create(model="beta", messages=HELLO, max_tokens=16, stream=True)
                answers["stream"] = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            else:
                reply = client.chat.completions.create(model="beta", messages=HELLO, max_tokens=16)
                answers["plain"] = reply.choices[0].message.content or ""
            timeline.add(f"{'stream' if streaming else 'plain'} answered")
        except openai.APIError as error:
            answers["error"] = repr(error)

    start = time.monotonic()
    requests = [threading.Thread(target=ask, args=(streaming,)) for streaming in (True, False)]
    for thread in requests:
        thread.start()
    # The gateway publishes what it holds; the operator's autoscaler reads it as demand.
    deadline = time.monotonic() + WAKE_SECONDS_AT_MOST
    while any(t.is_alive() for t in requests) and time.monotonic() < deadline:
        for pod in _gateway_pods(view, installed.system):
            held = httpx.get(f"http://{pod}:8080/held", timeout=5).json()["held"]
            held_seen += [entry["requests"] for entry in held if entry["name"] == "beta"]
        timeline.add(f"beta pods: {len(view.pods('beta'))}, ready: {len(view.ready_pods('beta'))}")
        time.sleep(0.5)
    for thread in requests:
        thread.join(timeout=10)
    woke_in = time.monotonic() - start
    print(f"\nscale from zero through the gateway: first answers after {woke_in:.1f} s\n{timeline}")
    assert "error" not in answers, f"{answers['error']}\n{timeline}"
    assert answers.get("stream") and answers.get("plain"), f"{answers}\n{timeline}"
    assert max(held_seen, default=0) == 2, f"the gateway's /held showed {held_seen}"
    # The gateway routes on the pod's readiness, the status follows on the operator's next reconcile.
    view.wait(
        lambda: ((view.get("modelserver", "beta") or {}).get("status") or {}).get("readyReplicas") == 1,
        "readyReplicas 1 in the status",
        60,
    )
    scaled = view.get("modelserver", "beta") or {}
    assert "held" in scaled["status"]["scaling"]["message"], scaled["status"]["scaling"]


def test_models_are_listed_per_key(installed: Installed) -> None:
    view = installed.view
    view.wait_phase("alpha", "Ready")
    view.wait_phase("beta", "Ready")
    key = view.secret_value("beta-api-keys", "api-key")
    listed = {m.id for m in _client(installed.base, key).models.list()}
    assert listed == {"alpha", "beta"}
    # Without a key, or with a wrong one, only the public model: nothing else is learned.
    anonymous = httpx.get(f"{installed.base}/v1/models", timeout=30).json()
    assert [m["id"] for m in anonymous["data"]] == ["alpha"]
    assert {m.id for m in _client(installed.base, "sk-wrong").models.list()} == {"alpha"}
    # One base URL, both models; the key is checked by beta's own sidecar.
    reply = _client(installed.base, key).chat.completions.create(model="alpha", messages=HELLO, max_tokens=8)
    assert reply.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        _client(installed.base, "sk-wrong").chat.completions.create(model="beta", messages=HELLO, max_tokens=8)
    with pytest.raises(openai.NotFoundError) as unknown:
        _client(installed.base, key).chat.completions.create(model="gamma", messages=HELLO, max_tokens=8)
    assert unknown.value.body["param"] == "model"  # type: ignore[index]


def test_named_keys_are_limited_counted_and_revoked_within_seconds(installed: Installed, node_cluster: Cluster) -> None:
    """`modelserve key create` issues two keys for beta (only their hashes stored); through the
    gateway, team-a (at most 1 request in flight) is refused a second one while team-b is served;
    beta's sidecar counts each by name as the clients counted; `key revoke` refuses team-b's key
    through the Service and the gateway within seconds (the operator makes the kubelet refresh the
    mounted keys at once)."""
    view = installed.view
    view.wait_phase("beta", "Ready")

    def cli(*args: str) -> str:
        command = [sys.executable, "-m", "modelserve.cli.main", "key", *args, "--for", "beta", "-n", view.namespace]
        return subprocess.run(
            command, env=node_cluster.env, capture_output=True, text=True, check=True, timeout=60
        ).stdout

    key_a = cli("create", "team-a", "--max-in-flight", "1").strip()
    key_b = cli("create", "team-b").strip()
    stored = view.secret_value("beta-api-keys", "team-a")
    assert key_a not in stored and json.loads(stored)["maxInFlight"] == 1
    client_a, client_b = _client(installed.base, key_a), _client(installed.base, key_b)
    # The held answer's 400 tokens took over 120 s once, on two cores shared with the rest of the suite.
    holder = _client(installed.base, key_a, timeout=600)
    view.wait(lambda: _accepted(client_b), "team-b's new key to be accepted", 120)

    (pod,) = view.ready_pods("beta")
    metrics_url = f"http://{pod['status']['podIP']}:{LISTEN_PORT}/metrics"
    long = {"max_tokens": 400, "logit_bias": NO_END}
    completion_b = 0
    requests = "modelserve_sidecar_key_requests_total"
    tokens = "modelserve_sidecar_key_tokens_total"
    before = (_series(metrics_url, requests, "team-b"), _series(metrics_url, tokens, "team-b", kind="completion"))
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(lambda: holder.chat.completions.create(model="beta", messages=PROMPT, **long))
        view.wait(
            lambda: _series(metrics_url, "modelserve_sidecar_key_in_flight_requests", "team-a") == 1, "a in flight", 60
        )
        with pytest.raises(openai.RateLimitError) as over:
            client_a.chat.completions.create(model="beta", messages=HELLO, max_tokens=4)
        assert over.value.body["code"] == "in_flight"  # type: ignore[index]
        for _ in range(2):  # team-b is served meanwhile
            reply = client_b.chat.completions.create(model="beta", messages=HELLO, max_tokens=8, **GREEDY)
            assert reply.usage is not None
            completion_b += reply.usage.completion_tokens
        assert held.result().choices[0].message.content
    # What the clients counted, as beta's sidecar counted it.
    assert _series(metrics_url, "modelserve_sidecar_key_refusals_total", "team-a", reason="in_flight") == 1
    after = (_series(metrics_url, requests, "team-b"), _series(metrics_url, tokens, "team-b", kind="completion"))
    assert (after[0] - before[0], after[1] - before[1]) == (2, completion_b)
    assert key_a not in httpx.get(metrics_url, timeout=10).text

    cli("revoke", "team-b")
    revoked = time.monotonic()
    service = _client(f"http://{view.cluster_ip('beta')}", key_b)
    view.wait(lambda: not _accepted(client_b) and not _accepted(service), "team-b's key to be refused", 120)
    print(f"team-b's key refused through the gateway and the Service {time.monotonic() - revoked:.1f} s after revoke")
    assert _accepted(client_a)  # the others stay


def _accepted(client: openai.OpenAI) -> bool:
    """The key opens beta (a one-token answer), or is refused (401)."""
    try:
        client.chat.completions.create(model="beta", messages=HELLO, max_tokens=1)
    except openai.AuthenticationError:
        return False
    return True


def _series(url: str, name: str, key: str, **labels: str) -> float:
    """One series of beta's sidecar, by key name (0 when absent)."""
    wanted = {"key": key, "model": "beta", **labels}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            found = dict(part.split("=", 1) for part in line[len(name) + 1 : line.index("}")].split(","))
            if {k: v.strip('"') for k, v in found.items()} == wanted:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


# llama.cpp's own routes, from its source (tests/fixtures/engine_routes), but the consumer ones and
# /metrics (the sidecar's and the gateway's own); before the allowlist a key holder (anyone, for a
# public model) reached those that are on by default: /slots, /props, /completion, /apply-template,
# /lora-adapters, the web UI, ...
ENGINE_ROUTES = [
    (route["method"], route["path"])
    for route in json.loads((REPO / f"tests/fixtures/engine_routes/llama.cpp-b{llamacpp.BUILD}.json").read_text())[
        "routes"
    ]
    if route["class"] != "consumer" and route["path"] != "/metrics"
] + [("GET", "/metrics/anything"), ("GET", "//slots"), ("GET", "/v1/../slots")]


def test_the_engines_own_routes_are_refused_through_the_service_and_the_gateway(installed: Installed) -> None:
    view = installed.view
    view.wait_phase("alpha", "Ready")
    body = {"model": "alpha", "messages": HELLO, "prompt": "hi", "n_predict": 1, "max_tokens": 1}
    for base in (f"http://{view.cluster_ip('alpha')}", installed.base):
        # llama-server b11434 logs no request: the engines' own decode counters show what arrives (every
        # refused route that generates would decode a token of `body`).
        before = _engine_decodes(view, "alpha")
        for method, path in ENGINE_ROUTES:
            answer = httpx.request(method, base + path, json=body if method == "POST" else None, timeout=30)
            assert answer.status_code == 404, (base, method, path, answer.text)
            assert answer.json()["error"]["code"] == "unknown_route", (base, method, path, answer.text)
        assert _engine_decodes(view, "alpha") == before, base
        # The consumer route still answers, through the same address, and is counted.
        chat = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert chat.status_code == 200 and chat.json()["choices"], chat.text
        assert sum(_engine_decodes(view, "alpha").values()) > sum(before.values()), base


# Inside a pod: llama-server's decode count, from its own /metrics on the pod's loopback.
ENGINE_DECODES = (
    "import urllib.request\n"
    f"text = urllib.request.urlopen('http://127.0.0.1:{llamacpp.ENGINE.port}/metrics', timeout=10).read().decode()\n"
    "print(next(line.split()[1] for line in text.splitlines() if line.startswith('llamacpp:n_decode_total ')))"
)


def _engine_decodes(view: NodeView, name: str) -> dict[str, float]:
    """Each serving pod's llama-server decode count."""
    out = {}
    for pod in view.pods(name):
        pod_name = pod["metadata"]["name"]
        probe = view.cluster.kubectl(
            "exec", "-n", view.namespace, pod_name, "-c", "sidecar", "--", "python", "-c", ENGINE_DECODES
        )
        out[pod_name] = float(probe.stdout.strip())
    return out


def test_a_slow_request_sends_the_next_ones_to_the_other_replica(installed: Installed) -> None:
    view = installed.view
    view.wait_phase("alpha", "Ready")
    assert len(view.ready_pods("alpha")) == 2
    view.wait(lambda: gateway_replicas(installed.base, "alpha") == 2, "the gateway routes to both replicas", 60)
    # The slow stream is cut once the quick requests are done; the gateway's counters say which of
    # them it routed while the slow one held its replica.
    slow = {"model": "alpha", "messages": PROMPT, "max_tokens": 1900, "stream": True, "logit_bias": NO_END}
    quick = {"model": "alpha", "messages": HELLO, "max_tokens": 4, **GREEDY}
    held, rounds = routed_beside_long_streams(installed.base, slow, quick)
    assert len(held) >= 4, f"too few quick requests routed beside the slow stream: {rounds}"
    assert all(slow_pod != quick_pod for slow_pod, quick_pod in held), rounds


def test_a_replica_deleted_under_load_loses_no_request(installed: Installed) -> None:
    view = installed.view
    view.wait_phase("alpha", "Ready")
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        deadline = time.monotonic() + 360  # beyond both waits below
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                answer = httpx.post(
                    f"{installed.base}/v1/chat/completions",
                    json={"model": "alpha", "messages": HELLO, "max_tokens": 4, **GREEDY},
                    timeout=120,
                )
                outcome = (answer.status_code, answer.headers.get("x-modelserve-replica") or answer.text[:200])
            except httpx.HTTPError as error:
                outcome = (0, repr(error))
            with lock:
                outcomes.append(outcome)

    def answered() -> int:
        with lock:
            return len(outcomes)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        # Counted in answers, not seconds: on a busy machine a fixed time held too few to mean much.
        view.wait(lambda: answered() >= BEFORE_DELETION, f"{BEFORE_DELETION} answers before the deletion", 120)
        victim = view.ready_pods("alpha")[0]["metadata"]["name"]
        view.kubectl("delete", "pod", victim, "--wait=false")
        deleted, at_deletion = time.monotonic(), answered()
        # Through the victim's drain and its removal from the gateway's replicas.
        view.wait(
            lambda: answered() >= at_deletion + AFTER_DELETION and time.monotonic() - deleted >= LOAD_SECONDS * 2 / 3,
            f"{AFTER_DELETION} answers and {LOAD_SECONDS * 2 / 3:.0f} s after the deletion",
            180,
        )
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=150)
    failures = [outcome for outcome in outcomes if outcome[0] != 200]
    after = [pod for _, pod in outcomes[at_deletion:]]
    print(
        f"\n{len(outcomes)} requests under load, {victim} deleted after {at_deletion}; answered by {sorted(set(after))}"
    )
    assert not failures, failures


def test_in_cluster_openai_clients_reach_models_by_their_advertised_names(installed: Installed) -> None:
    """The official SDK in a pod of the cluster (the openai-client image), calling a private
    llama.cpp model and a vLLM model by the base URLs their status advertises, verbatim: each
    one's Service (`status.endpoint`) and the gateway's (`status.gatewayEndpoint`), names that
    only the cluster's DNS resolves; `Key` and `Bearer`, streaming and not."""
    view = installed.view
    view.apply(vllm_example("vllm"))
    statuses = {name: view.wait_phase(name, "Ready", VLLM_READY_SECONDS)["status"] for name in ("beta", "vllm")}
    calls, keys = [], {}
    for name, status in statuses.items():
        keys[f"{name.upper()}_KEY"] = (f"{name}-api-keys", "api-key")
        for route in ("endpoint", "gatewayEndpoint"):
            for scheme, stream in (("Key", False), ("Key", True), ("Bearer", False), ("Bearer", True)):
                calls.append(
                    {
                        "name": f"{name} {route} {scheme} {'stream' if stream else 'plain'}",
                        "base_url": status[route],
                        "model": name,
                        "key_env": f"{name.upper()}_KEY",
                        "scheme": scheme,
                        "stream": stream,
                    }
                )
    assert statuses["beta"]["endpoint"] == f"http://beta.{view.namespace}.svc.cluster.local/v1"
    results = client_calls(view.cluster, view.namespace, "in-cluster-client", calls, keys, timeout=600)
    failed = {name: result for name, result in results.items() if not result.get("content")}
    assert not failed, failed
    assert all(result["chunks"] > 1 for name, result in results.items() if name.endswith("stream")), results
    # SmolLM2 at temperature 0 knows this one, through llama.cpp (its GGUF) and through vLLM (the same
    # weights dequantized), whichever way it was reached.
    assert all("Paris" in result["content"] for result in results.values()), results
    print("\nin-cluster client:\n" + "\n".join(f"{name}: {result['content']!r}" for name, result in results.items()))


def test_the_gateway_serves_https_from_a_tls_secret_and_follows_its_renewal(
    installed: Installed, node_cluster: Cluster, tmp_path: Path
) -> None:
    """Last: `helm upgrade` turns the gateway's TLS on from a kubernetes.io/tls Secret (cert-manager's
    shape); the openai SDK trusting the sandbox's CA gets an answer over HTTPS, a client that does
    not trust it is refused, and a renewed Secret is served once the kubelet has refreshed it."""
    view, system = installed.view, installed.system
    view.wait_phase("alpha", "Ready")
    address = installed.base.removeprefix("http://")
    ca = CA("modelserve sandbox CA")
    ca_file = ca.write(tmp_path / "ca.crt")
    hosts = (f"{GATEWAY}.{system}.svc.cluster.local", f"{GATEWAY}.{system}.svc", address)

    def put_secret(issued: Issued) -> None:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gateway-tls", "namespace": system}}
        node_cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({**secret, "type": "kubernetes.io/tls", "stringData": issued.files()})
        )

    first = ca.issue(hosts=hosts)
    put_secret(first)
    # The gateway's CA for the sidecars serving HTTPS (trust-manager's shape: a ConfigMap), in the same
    # upgrade (one roll of the gateway).
    bundle = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "model-ca", "namespace": system}}
    node_cluster.kubectl("apply", "-f", "-", input=json.dumps({**bundle, "data": {"ca.crt": ca.pem}}))
    node_cluster.helm(
        "upgrade", RELEASE, str(REPO / "charts" / "modelserve"), "-n", system, "--reuse-values",
        "--set", "gateway.tls.secretName=gateway-tls", "--set", "gateway.service.port=443",
        "--set", "gateway.upstreamTLS.caConfigMap=model-ca",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    base = f"https://{address}"

    def serial() -> int | None:
        try:
            return served_certificate(443, ca_file, host=address, address=address).serial_number
        except OSError:  # the Service's new port not routed yet, or an old pod's plain HTTP
            return None

    view.wait(lambda: serial() == first.serial, "the gateway's Service serving the Secret's certificate", 120)
    with httpx.Client(verify=str(ca_file), timeout=120) as trusting:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", http_client=trusting, max_retries=0)
        reply = client.chat.completions.create(model="alpha", messages=HELLO, max_tokens=8, **GREEDY)
        assert reply.choices[0].message.content
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{base}/healthz", timeout=30)  # the system's trust store: no sandbox CA in it
    alpha = view.get("modelserver", "alpha") or {}
    assert alpha["status"]["gatewayEndpoint"] == f"https://{GATEWAY}.{system}.svc.cluster.local/v1"
    # A renewal, as cert-manager writes it: the kubelet refreshes the mounted Secret on its own sync
    # (about a minute at its defaults), the gateway within a second of the files' change.
    renewed = ca.issue(hosts=hosts)
    put_secret(renewed)
    edited = time.monotonic()
    # While the kubelet takes its time with the renewal, alpha's pods roll onto spec.tls: one wait for both.
    alpha_certificate = _roll_onto_tls(view, ca)
    view.wait(lambda: serial() == renewed.serial, "the renewed certificate served", 180)
    print(f"\ngateway TLS: the renewed Secret served {time.monotonic() - edited:.0f} s after it was written")
    restarts = [c["restartCount"] for p in _gateway_pod_bodies(view, system) for c in p["status"]["containerStatuses"]]
    assert set(restarts) == {0}, restarts  # followed, not restarted
    _sidecars_serve_https_behind_the_gateway(view, alpha_certificate, ca_file, base)


def _roll_onto_tls(view: NodeView, ca: CA) -> Issued:
    """alpha's spec.tls names a kubernetes.io/tls Secret issued for its Service (its pods roll)."""
    service = f"alpha.{view.namespace}.svc"
    issued = ca.issue(hosts=(service, f"{service}.cluster.local"))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "alpha-tls", "namespace": view.namespace}}
    view.cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({**secret, "type": "kubernetes.io/tls", "stringData": issued.files()})
    )
    # Replace: an old pod goes first. The node's CPU is spoken for by then (alpha, the woken beta and the
    # vLLM model of the in-cluster test), so a surge pod would wait for good (InsufficientCPU).
    tls = {"secretName": "alpha-tls"}
    view.apply(cpu_server("alpha", public=True, replicas={"min": 2, "max": 2}, tls=tls, rolloutStrategy="Replace"))
    return issued


def _sidecars_serve_https_behind_the_gateway(view: NodeView, issued: Issued, ca_file: Path, base: str) -> None:
    """Then the hop from the gateway to each sidecar: alpha's pods serve HTTPS with the Secret's
    certificate, the gateway (trusting the CA from its ConfigMap) checks it for alpha's Service name
    and answers through them, and plain HTTP to a pod is no longer answered."""
    service = f"alpha.{view.namespace}.svc"

    def serving_https() -> bool:
        ready = view.ready_pods("alpha")
        return len(ready) == 2 and len(view.pods("alpha")) == 2 and all(serves_tls(pod) for pod in ready)

    def state() -> str:
        pods = view.kubectl("get", "pods", "-o", "wide", check=False).stdout
        alpha = view.get("modelserver", "alpha") or {}
        conditions = [
            (c["type"], c["status"], c.get("reason"), c.get("message")) for c in alpha["status"]["conditions"]
        ]
        nodes = view.cluster.kubectl("describe", "nodes", check=False).stdout
        allocated = nodes[nodes.find("Allocated resources") :][:600]
        return f"\n{pods}\n{conditions}\n{allocated}"

    wait_until(serving_https, 300, "alpha's two pods Ready and serving HTTPS", 0.5, state)
    addresses = [pod["status"]["podIP"] for pod in view.ready_pods("alpha")]
    for address in addresses:  # each sidecar presents the Secret's certificate for the Service's name
        served = served_certificate(LISTEN_PORT, ca_file, host=service, address=address)
        assert served.serial_number == issued.serial
    with pytest.raises(httpx.TransportError):  # no plain HTTP on a pod any more
        httpx.post(f"http://{addresses[0]}:{LISTEN_PORT}/v1/chat/completions", json={"model": "alpha"}, timeout=30)
    with httpx.Client(verify=str(ca_file), timeout=120) as trusting:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", http_client=trusting, max_retries=0)
        for _ in range(4):  # both replicas, whichever the gateway picks
            reply = client.chat.completions.create(model="alpha", messages=HELLO, max_tokens=8, **GREEDY)
            assert reply.choices[0].message.content
        metrics = trusting.get(f"{base}/metrics").text
    tls_errors = [line for line in metrics.splitlines() if "upstream_errors_total" in line and 'kind="tls"' in line]
    assert not tls_errors, tls_errors
    alpha = view.get("modelserver", "alpha") or {}
    assert alpha["status"]["endpoint"] == f"https://{service}.cluster.local/v1"


def _gateway_pod_bodies(view: NodeView, system: str) -> list[dict]:
    out = view.cluster.kubectl("get", "pods", "-n", system, "-l", "app.kubernetes.io/component=gateway", "-o", "json")
    return [pod for pod in json.loads(out.stdout)["items"] if not pod["metadata"].get("deletionTimestamp")]


def _gateway_pods(view: NodeView, system: str) -> list[str]:
    return [pod["status"]["podIP"] for pod in _gateway_pod_bodies(view, system) if pod.get("status", {}).get("podIP")]
