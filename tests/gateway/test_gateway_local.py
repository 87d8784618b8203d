"""The gateway's behaviour at its edges, fast: the gateway (in this process, on uvicorn) in front of
real sidecar processes, each before the replay upstream (vLLM's recorded bytes). The directory is a
fixed table (FixedDiscovery) the tests change as the Kubernetes watches would; the watches, the
real engine and the operator's side are proven in tests/realnode/test_gateway_on_node.py.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from harness.in_process import serving_gateway
from harness.sidecar import (
    API_KEY,
    ENGINE_TABLES,
    MARK_HEADER,
    METHODS,
    SPELLED,
    RawAnswer,
    ReplayEngine,
    SecretDir,
    Sidecar,
    assert_refused_here,
    dechunk,
    free_ports,
    launch_sidecar,
    metric_value,
    raw_request,
    refused_counts,
    refused_routes,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.contracts import routes
from modelserve.contracts.gateway import OWN_ROUTES
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve.http import ollama
from modelserve_sandbox.processes import wait_until

DEAD = "127.0.0.1:9"  # nothing listens on the discard port: connections are refused
HELLO = [{"role": "user", "content": "hi"}]
MAX_HELD = 2
MAX_HELD_UNVERIFIED = 4  # per model, for keys the gateway has not seen open it (2 per client: the default)
LIST_ASKS = 5  # sidecars asked per model list
# Long enough that holding two requests, filling the queue and releasing it fit inside it on a
# starved machine; the tests of the timeout itself wait it out.
HOLD_SECONDS = 10


@dataclass
class Setup:
    base: str
    discovery: FixedDiscovery
    public: list[str]  # addresses of the public sidecars
    private: str  # address of the private one
    replay: ReplayEngine  # the engine behind every sidecar


def _model(namespace: str, replicas: list[str], public: bool = True) -> Model:
    pods = {address: f"{namespace}-pod-{i}" for i, address in enumerate(replicas)}
    ring = Ring(replicas) if replicas else None
    return Model(namespace, "tiny", public, replicas=tuple(replicas), pods=pods, ring=ring)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = tmp_path_factory.mktemp("gateway")
    replay: ReplayEngine = start_replay()
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecars: list[Sidecar] = []
    try:
        for env in ({"MODELSERVE_AUTH": "public"},) * 2 + ({"MODELSERVE_KEYS_DIR": str(base / "keys")},):
            sidecars.append(launch_sidecar(base / "logs", replay.url, "tiny", env))
        for sidecar in sidecars:
            wait_ready(sidecar)
        public = [s.url.removeprefix("http://") for s in sidecars[:2]]
        private = sidecars[2].url.removeprefix("http://")
        discovery = FixedDiscovery(
            [_model("a", [DEAD, *public]), _model("b", [private], public=False), _model("c", [])]
        )
        (port,) = free_ports(1)
        settings = GatewaySettings.from_env(
            {
                "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
                "MODELSERVE_GATEWAY_HOLD_SECONDS": str(HOLD_SECONDS),
                "MODELSERVE_GATEWAY_MAX_HELD": str(MAX_HELD),
                "MODELSERVE_GATEWAY_MAX_HELD_UNVERIFIED": str(MAX_HELD_UNVERIFIED),
                "MODELSERVE_GATEWAY_MODEL_LIST_ASKS": str(LIST_ASKS),
                "MODELSERVE_GATEWAY_MAX_BODY_BYTES": "4096",
            }
        )
        with serving_gateway(settings, discovery) as url:
            yield Setup(url, discovery, public, private, replay)
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
        replay.stop()


def _chat(setup: Setup, model: str, **extra: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(
        f"{setup.base}/v1/chat/completions",
        json={"model": model, "messages": HELLO, **extra},
        headers=headers,
        timeout=30,
    )


def _metric(setup: Setup, sample: str) -> float:
    return metric_value(httpx.get(setup.base + "/metrics", timeout=10).text, sample)


def test_a_refused_connection_is_retried_on_another_replica(setup: Setup) -> None:
    retries = 'modelserve_gateway_routing_decisions_total{decision="retry",model="tiny",namespace="a"}'
    before = _metric(setup, retries)
    answers = []
    # Ties go to a random replica, the dead one a third of the time: ask until it was tried (the
    # chance that 60 never pick it is 3e-11).
    while len(answers) < 60 and (len(answers) < 12 or _metric(setup, retries) == before):
        answers.append(_chat(setup, "a/tiny"))
    assert [a.status_code for a in answers] == [200] * len(answers)
    assert {a.headers["x-modelserve-replica"] for a in answers} <= {"a-pod-1", "a-pod-2"}
    assert _metric(setup, 'modelserve_gateway_upstream_errors_total{kind="connect",model="tiny",namespace="a"}') > 0
    assert _metric(setup, 'modelserve_gateway_routing_decisions_total{decision="retry",model="tiny",namespace="a"}') > 0


def test_a_replica_answering_503_is_retried_on_another(setup: Setup, tmp_path: Path) -> None:
    """A sidecar whose engine went away answers 503 before any byte reached the client: another
    replica answers instead. The 503 comes on the connection the gateway pooled while that replica
    still answered (the express lane's, which hands it on to the retry)."""
    engine = start_replay()
    failing = launch_sidecar(tmp_path, engine.url, "tiny", {"MODELSERVE_AUTH": "public"})
    key = ("d", "tiny")
    engine_running = True
    try:
        wait_ready(failing)
        setup.discovery.update(_model("d", [failing.url.removeprefix("http://"), setup.public[0]]))
        answered = []  # ties go to a random replica: until the failing one answered (40 at most)
        while len(answered) < 40 and "d-pod-0" not in answered:
            answered.append(_chat(setup, "d/tiny").headers.get("x-modelserve-replica"))
        assert "d-pod-0" in answered
        engine.stop()  # the gateway's connection to that sidecar stays pooled, idle for 3 s
        engine_running = False
        retried = 'modelserve_gateway_upstream_errors_total{kind="status_503",model="tiny",namespace="d"}'
        answers = []
        while len(answers) < 40 and _metric(setup, retried) == 0:
            answers.append(_chat(setup, "d/tiny"))
        assert _metric(setup, retried) == 1
        assert [(a.status_code, a.headers["x-modelserve-replica"]) for a in answers] == [(200, "d-pod-1")] * len(
            answers
        )
    finally:
        setup.discovery.update(key)
        stop_sidecar(failing)
        if engine_running:
            engine.stop()


def test_streams_pass_through_whole(setup: Setup) -> None:
    with httpx.stream(
        "POST", f"{setup.base}/v1/chat/completions", json={"model": "a/tiny", "messages": HELLO, "stream": True}
    ) as answer:
        body = b"".join(answer.iter_raw())
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert body.rstrip().endswith(b"data: [DONE]")


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (json.dumps({"model": "b/tiny", "messages": HELLO}).encode(), API_KEY),
        (json.dumps({"model": "b/tiny", "messages": HELLO, "stream": True}).encode(), API_KEY),
        (json.dumps({"model": "b/tiny", "messages": HELLO}).encode(), "sk-wrong"),
        (json.dumps({"model": "nope", "messages": HELLO}).encode(), API_KEY),
        (b'{"model": ', API_KEY),
        (b"x" * 5000, API_KEY),
    ],
    ids=["chat", "stream", "wrong-key", "unknown-model", "bad-json", "too-big"],
)
def test_the_fast_lane_answers_as_the_asgi_way(setup: Setup, body: bytes, key: str) -> None:
    """The server's fast lane (direct.py) takes /v1/chat/completions; the same route spelt with a
    percent-encoded letter goes the ASGI way: both answers are the same bytes (but the Date)."""
    host, port = setup.base.removeprefix("http://").rsplit(":", 1)
    answers = []
    for target in ("/v1/chat/completions", "/v1/chat/%63ompletions"):
        head = f"POST {target} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(head.encode() + body)
            raw = b"".join(iter(lambda: connection.recv(65536), b""))
        status_and_headers, _, rest = raw.partition(b"\r\n\r\n")
        kept = [line for line in status_and_headers.split(b"\r\n") if not line.lower().startswith(b"date:")]
        # A stream's chunks follow the engine's timing: compare what they carry.
        answers.append((kept, dechunk(rest) if b"transfer-encoding: chunked" in kept else rest))
    assert answers[0][0][0].startswith(b"HTTP/1.1 "), answers[0]
    assert answers[0] == answers[1]


def test_refusals_are_openai_shaped(setup: Setup) -> None:
    ambiguous = _chat(setup, "tiny")
    assert ambiguous.status_code == 400 and ambiguous.json()["error"]["code"] == "ambiguous_model"
    assert "'a/tiny'" in ambiguous.json()["error"]["message"]
    unknown = _chat(setup, "nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    too_big = httpx.post(f"{setup.base}/v1/chat/completions", content=b"x" * 5000, timeout=10)
    assert too_big.status_code == 413
    route = httpx.post(f"{setup.base}/v1/whatever", json={"model": "a/tiny"}, timeout=10)
    assert route.status_code == 404 and route.json()["error"]["code"] == "unknown_route"
    # The key is the replica sidecar's business: a wrong one is its 401, passed through.
    wrong = httpx.post(
        f"{setup.base}/v1/chat/completions",
        json={"model": "b/tiny", "messages": HELLO},
        headers={"Authorization": "Bearer sk-wrong"},
        timeout=10,
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_models_are_listed_per_key(setup: Setup) -> None:
    def ids(headers: dict[str, str]) -> list[str]:
        return [m["id"] for m in httpx.get(f"{setup.base}/v1/models", headers=headers, timeout=10).json()["data"]]

    assert ids({}) == ["a/tiny", "c/tiny"]  # public only
    assert ids({"Authorization": "Bearer sk-wrong"}) == ["a/tiny", "c/tiny"]
    assert ids({"Authorization": f"Key {API_KEY}"}) == ["a/tiny", "b/tiny", "c/tiny"]
    one = httpx.get(f"{setup.base}/v1/models/b/tiny", headers={"Authorization": "Bearer sk-wrong"}, timeout=10)
    assert one.status_code == 404


def test_held_requests_wait_then_go_when_a_replica_is_ready(setup: Setup) -> None:
    results: dict[str, httpx.Response] = {}

    def ask(name: str, **extra: object) -> None:
        results[name] = _chat(setup, "c/tiny", **extra)

    threads = [
        threading.Thread(target=ask, args=("plain",)),
        threading.Thread(target=ask, args=("stream",), kwargs={"stream": True}),
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: _held(setup) == MAX_HELD, 5, "both requests held")
        full = _chat(setup, "c/tiny")
        assert full.status_code == 429 and full.headers["retry-after"]
        assert full.json()["error"]["code"] == "hold_queue_full"
        setup.discovery.update(_model("c", [setup.public[0]]))  # a replica turned Ready
    finally:
        for thread in threads:
            thread.join(15)
    assert results["plain"].status_code == 200 and results["plain"].headers["x-modelserve-replica"] == "c-pod-0"
    assert results["stream"].status_code == 200 and results["stream"].text.rstrip().endswith("data: [DONE]")
    assert _held(setup) == 0
    setup.discovery.update(_model("c", []))  # back to zero


def test_a_held_request_times_out_with_retry_after_and_a_gone_client_leaves(setup: Setup) -> None:
    start = time.monotonic()
    answer = _chat(setup, "c/tiny")
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "model_starting"
    assert answer.headers["retry-after"] and time.monotonic() - start >= HOLD_SECONDS
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{setup.base}/v1/chat/completions", json={"model": "c/tiny", "messages": HELLO}, timeout=0.5)
    wait_until(lambda: _held(setup) == 0, 5, "the gone client's request to leave the queue")
    sample = 'modelserve_gateway_hold_seconds_count{model="tiny",namespace="c",outcome="client_gone"}'
    assert _metric(setup, sample) >= 1


def _held(setup: Setup, namespace: str = "c") -> int:
    held = httpx.get(f"{setup.base}/held", timeout=5).json()["held"]
    return sum(entry["requests"] for entry in held if entry["namespace"] == namespace)


def test_ollama_clients_reach_models_through_the_gateway(setup: Setup) -> None:
    import ollama

    client = ollama.Client(host=setup.base, headers={"Authorization": f"Bearer {API_KEY}"})
    assert [m.model for m in client.list().models] == ["a/tiny:latest", "b/tiny:latest", "c/tiny:latest"]
    assert client.chat(model="a/tiny:latest", messages=HELLO, stream=False).message.content
    streamed = "".join(part.message.content or "" for part in client.chat(model="b/tiny", messages=HELLO, stream=True))
    assert streamed
    anonymous = ollama.Client(host=setup.base)
    assert [m.model for m in anonymous.list().models] == ["a/tiny:latest", "c/tiny:latest"]
    with pytest.raises(ollama.ResponseError) as refused:
        anonymous.chat(model="b/tiny", messages=HELLO, stream=False)
    assert refused.value.status_code == 401


# --- a client without a key, or with a made-up one, costs the gateway nothing ----------------------


def _made_up() -> str:
    return "sk-" + secrets.token_hex(16)


def _post_from(
    setup: Setup, address: str, model: str, key: str | None, path: str = "/v1/chat/completions"
) -> httpx.Response:
    """A request from the client address `address` (any of 127/8 is this host's)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # Plain HTTP: no TLS context to build (40 ms each).
    transport = httpx.HTTPTransport(local_address=address, verify=False)
    with httpx.Client(transport=transport, verify=False, timeout=30) as client:
        return client.post(setup.base + path, json={"model": model, "messages": HELLO}, headers=headers)


def _held_ever(setup: Setup, namespace: str) -> float:
    """Requests the gateway has held for `namespace`/tiny (or turned away as full), by its histogram."""
    outcomes = ("ready", "timeout", "full", "client_gone")
    sample = 'modelserve_gateway_hold_seconds_count{{model="tiny",namespace="{}",outcome="{}"}}'
    return sum(_metric(setup, sample.format(namespace, outcome)) for outcome in outcomes)


def test_a_request_without_a_key_is_refused_at_once_unless_its_model_is_public(setup: Setup) -> None:
    """A request with no key for a private model at zero could never pass: the gateway answers it
    with the sidecar's own 401, never holds it, never counts it as demand. An unknown model, or a
    name a private model shares, answers the same: no key, no telling which private models exist."""
    sidecars = httpx.post(
        f"http://{setup.private}/v1/chat/completions", json={"model": "tiny", "messages": HELLO}, timeout=10
    )
    assert sidecars.status_code == 401
    setup.discovery.update(_model("b", [], public=False))  # at zero
    before = _held_ever(setup, "b")
    try:
        with ThreadPoolExecutor(16) as pool:
            models = ["b/tiny", "nope", "elsewhere/tiny", "tiny"] * 15
            answers = list(pool.map(lambda m: _post_from(setup, "127.0.0.1", m, None), models))
        assert [a.status_code for a in answers] == [401] * len(models)
        assert {a.content for a in answers} == {sidecars.content}
        assert {a.headers["www-authenticate"] for a in answers} == {sidecars.headers["www-authenticate"]}
        assert _held(setup, "b") == 0 and _held_ever(setup, "b") == before
        # One model by name: without a key, a name a private model shares is any unseen model's 404.
        one = httpx.get(f"{setup.base}/v1/models/tiny", timeout=10)
        assert one.status_code == 404 and one.json()["error"]["code"] == "model_not_found"
        keyed = httpx.get(f"{setup.base}/v1/models/tiny", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
        assert keyed.status_code == 400 and keyed.json()["error"]["code"] == "ambiguous_model"
    finally:
        setup.discovery.update(_model("b", [setup.private], public=False))


def test_made_up_keys_wait_in_a_small_share_and_never_take_a_verified_clients_place(setup: Setup) -> None:
    """60 requests with made-up keys for a private model at zero: a few wait (a new key can only be
    checked by a replica, so they are demand), at most 2 per client address, MAX_HELD_UNVERIFIED
    in all; the rest are 429 at once, and a client whose key the gateway saw open the model is
    still held (the same address included) and answered when a replica is ready."""
    assert _chat(setup, "b/tiny").status_code == 200  # relayed: b's replica let API_KEY through
    setup.discovery.update(_model("b", [], public=False))  # at zero
    pool = ThreadPoolExecutor(64)
    held: list[Future[httpx.Response]] = []
    try:
        # One client address: two wait, the next is turned away (on the fast lane and the ASGI way).
        held += [pool.submit(_post_from, setup, "127.0.0.2", "b/tiny", _made_up()) for _ in range(2)]
        wait_until(lambda: _held(setup, "b") == 2, 10, "one client's two requests held")
        for path in ("/v1/chat/completions", "/api/chat"):
            third = _post_from(setup, "127.0.0.2", "b/tiny", _made_up(), path)
            assert third.status_code == 429 and third.headers["retry-after"], third.text
        # Many addresses: the model's share fills, every other request is turned away at once.
        rest = [pool.submit(_post_from, setup, f"127.0.0.{3 + i // 2}", "b/tiny", _made_up()) for i in range(56)]
        turned_away = 56 - (MAX_HELD_UNVERIFIED - 2)
        wait_until(lambda: sum(f.done() for f in rest) >= turned_away, 20, "the requests beyond the share answered")
        assert _held(setup, "b") == MAX_HELD_UNVERIFIED
        answered = [f.result() for f in rest if f.done()]
        assert len(answered) == turned_away
        assert {(a.status_code, a.json()["error"]["code"]) for a in answered} == {(429, "hold_queue_full")}
        held += [f for f in rest if not f.done()]
        # The verified client, from the address already at its limit: held beside them.
        verified = pool.submit(_post_from, setup, "127.0.0.2", "b/tiny", API_KEY)
        wait_until(lambda: _held(setup, "b") == MAX_HELD_UNVERIFIED + 1, 10, "the verified request held")
        assert not verified.done()
    finally:
        setup.discovery.update(_model("b", [setup.private], public=False))  # a replica is ready: all go on
        pool.shutdown(wait=True)
    assert verified.result().status_code == 200
    assert {(f.result().status_code, f.result().json()["error"]["code"]) for f in held} == {(401, "invalid_api_key")}
    assert _held(setup, "b") == 0


def test_a_model_list_asks_a_few_sidecars_whatever_the_key(setup: Setup) -> None:
    """Each list asks at most LIST_ASKS sidecars whether the key opens their model, counted by the
    sidecars themselves and by the gateway; a real key's next lists ask the next ones."""
    many = [_model(f"p{i:02d}", [setup.private], public=False) for i in range(3 * LIST_ASKS)]
    refused = 'modelserve_gateway_model_list_asks_total{answer="refused"}'
    opened = 'modelserve_gateway_model_list_asks_total{answer="opened"}'
    invalid = 'modelserve_sidecar_auth_failures_total{reason="invalid"}'

    def sidecar_invalid() -> float:
        return metric_value(httpx.get(f"http://{setup.private}/metrics", timeout=10).text, invalid)

    def ids(key: str) -> list[str]:
        answer = httpx.get(f"{setup.base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        return [m["id"] for m in answer.json()["data"]]

    for model in many:
        setup.discovery.update(model)
    try:
        for _ in range(3):  # a new made-up key each time: nothing cached helps
            before = (_metric(setup, refused), sidecar_invalid())
            assert ids(_made_up()) == ["a/tiny", "c/tiny"]
            assert (_metric(setup, refused) - before[0], sidecar_invalid() - before[1]) == (LIST_ASKS, LIST_ASKS)
        lists = []
        for _ in range(4):  # b and the 3 * LIST_ASKS others, LIST_ASKS a list
            before_opened = _metric(setup, opened)
            lists.append([name for name in ids(API_KEY) if name.startswith("p")])
            assert _metric(setup, opened) - before_opened <= LIST_ASKS
        assert len(lists[0]) <= LIST_ASKS
        assert lists[-1] == [f"{m.namespace}/tiny" for m in many]
    finally:
        for model in many:
            setup.discovery.update(model.key)


# --- the allowlist: the gateway refuses what a sidecar would, before routing ------------------------

ANY_BODY = json.dumps({"model": "a/tiny", "messages": HELLO, "prompt": "hi", "input": "hi"}).encode()


def _send(setup: Setup, method: str, target: str, mark: str) -> RawAnswer:
    body = ANY_BODY if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    return raw_request(setup.base, method, target, {"Content-Type": "application/json", MARK_HEADER: mark}, body)


def _answered_by_the_gateway(method: str, path: str) -> bool:
    """Its own routes, and one model by id (`GET /v1/models/<name>`), which it looks up itself."""
    return path in OWN_ROUTES or (method == "GET" and path.startswith("/v1/models/"))


@pytest.mark.parametrize("table", ENGINE_TABLES)
def test_every_engine_route_outside_the_allowlist_is_the_gateways_404(setup: Setup, table: str) -> None:
    refused = [r for r in refused_routes(table) if not _answered_by_the_gateway(r["method"], r["path"])]
    before = refused_counts(httpx.get(setup.base + "/metrics", timeout=10).text, "gateway")
    for route in refused:
        assert_refused_here(_send(setup, route["method"], route["path"], table), route["method"], route["path"])
    assert setup.replay.marked(table) == []
    counted = refused_counts(httpx.get(setup.base + "/metrics", timeout=10).text, "gateway")
    counted.subtract(before)
    assert +counted == Counter(route["class"] for route in refused)


@pytest.mark.parametrize("method", METHODS)
def test_any_method_and_spelling_is_refused_or_routed_as_checked(setup: Setup, method: str) -> None:
    for i, target in enumerate(SPELLED):
        mark = f"gateway-{method}-{i}"
        answer = _send(setup, method, target, mark)
        decoded = unquote(target.partition("?")[0])
        arrived = setup.replay.marked(mark)
        if _answered_by_the_gateway(method, decoded):
            assert answer.status == 404 and arrived == [], (method, target, answer)
        elif routes.allowed(method, decoded) is None:
            assert_refused_here(answer, method, decoded)
            assert arrived == [], (method, target)
        else:
            assert answer.status < 500, (method, target, answer)
            assert all(path in routes.ALLOWED_PATHS for _, path in arrived), (method, target, arrived)
            if method == "POST" and not decoded.startswith(routes.OLLAMA_PREFIX):
                assert arrived == [(method, decoded)], (method, target, arrived)


def test_every_api_answer_is_in_ollamas_shape(setup: Setup) -> None:
    chat = f"{setup.base}/api/chat"
    keyed = {"Authorization": f"Bearer {API_KEY}"}
    answers = {
        "unknown model": (httpx.post(chat, json={"model": "nope", "messages": HELLO}, headers=keyed, timeout=10), 404),
        "no model": (httpx.post(chat, json={"messages": HELLO}, timeout=10), 400),
        "bad JSON": (httpx.post(chat, content=b'{"model": ', timeout=10), 400),
        "ambiguous": (httpx.post(chat, json={"model": "tiny", "messages": HELLO}, headers=keyed, timeout=10), 400),
        "too big": (httpx.post(chat, content=b"x" * 5000, timeout=10), 413),
        "not served": (httpx.post(f"{setup.base}/api/pull", json={"model": "a/tiny"}, timeout=10), 404),
        "wrong method": (httpx.get(chat, timeout=10), 404),
        "key": (httpx.post(chat, json={"model": "b/tiny", "messages": HELLO}, timeout=10), 401),
        # Without a key, an unknown model and a name a private model shares answer as a private one.
        "no key, unknown": (httpx.post(chat, json={"model": "nope", "messages": HELLO}, timeout=10), 401),
        "no key, ambiguous": (httpx.post(chat, json={"model": "tiny", "messages": HELLO}, timeout=10), 401),
        "held too long": (httpx.post(chat, json={"model": "c/tiny", "messages": HELLO}, timeout=30), 503),
    }
    for case, (answer, status) in answers.items():
        assert answer.status_code == status, (case, answer.text)
        body = answer.json()
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], (case, body)
    assert answers["held too long"][0].headers["retry-after"]


def test_ollama_ps_lists_the_ready_models_a_key_opens(setup: Setup) -> None:
    import ollama as ollama_client

    keyed = ollama_client.Client(host=setup.base, headers={"Authorization": f"Bearer {API_KEY}"})
    loaded = keyed.ps().models
    assert [m.model for m in loaded] == ["a/tiny:latest", "b/tiny:latest"]  # c has no ready replica
    assert all(m.expires_at is not None and m.expires_at.year == 2318 for m in loaded)
    assert [m.model for m in ollama_client.Client(host=setup.base).ps().models] == ["a/tiny:latest"]
    with pytest.raises(ollama_client.ResponseError) as unknown:
        keyed.chat(model="nope", messages=HELLO)
    assert unknown.value.status_code == 404
    assert unknown.value.error == "The model 'nope' does not exist or is not served through this gateway."
    assert ollama.LOADED_FOREVER.startswith("2318-")
