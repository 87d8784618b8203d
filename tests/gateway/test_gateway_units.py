"""The gateway's pure parts: replica choice, conversation prefixes, the directory, request parsing,
what it knows of keys, holding, settings, and the operator's sum of what gateways hold."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from harness.sidecar import hostile_json
from modelserve.contracts.env import ConfigError
from modelserve.contracts.gateway import held_from_json, held_to_json
from modelserve.gateway.catalog import model_objects, ollama_entries
from modelserve.gateway.directory import Ambiguous, Directory, Model, model_of, served_name
from modelserve.gateway.holding import Holding, Outcome
from modelserve.gateway.keys import OPENED_MEMORY_SECONDS, Opened, Recent, digest, keyless, proof
from modelserve.gateway.metrics import GatewayMetrics
from modelserve.gateway.proxy import GatewayProxy
from modelserve.gateway.request_read import parse_request
from modelserve.gateway.routing import Ring, affinity_key, conversation_prefix, least_in_flight
from modelserve.gateway.settings import GatewaySettings
from modelserve.http.downstream import Exchange
from modelserve.http.errors import ErrorResponse, unauthorized
from modelserve.http.limits import client_bucket
from modelserve.operator.autoscaling import gateway_addresses, total_held

A, B, C = "10.88.0.2:8080", "10.88.0.3:8080", "10.88.0.4:8080"


# --- least in flight ---------------------------------------------------------------------------


def test_least_in_flight_takes_the_least_busy_replica() -> None:
    rng = random.Random(1)
    assert least_in_flight([A, B, C], {A: 3, B: 1, C: 2}, rng) == B
    assert least_in_flight([A, B, C], {A: 3, B: 1, C: 2}, rng, exclude=[B]) == C
    assert least_in_flight([A], {}, rng, exclude=[A]) is None
    assert least_in_flight([], {}, rng) is None


def test_least_in_flight_shares_ties_at_random() -> None:
    rng = random.Random(7)
    picks = Counter(least_in_flight([A, B, C], {A: 1}, rng) for _ in range(600))
    assert set(picks) == {B, C} and min(picks.values()) > 200


# --- prefix affinity ---------------------------------------------------------------------------


def _chat(system: str, *turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def test_a_conversation_keeps_its_prefix_as_it_grows() -> None:
    first = conversation_prefix(_chat("You are terse.", "hello"))
    third = conversation_prefix(_chat("You are terse.", "hello", "hi!", "and now?"))
    assert first == third
    assert conversation_prefix(_chat("You are verbose.", "hello")) != first
    assert conversation_prefix({"prompt": "Once upon a time"}) == b"Once upon a time"
    assert conversation_prefix({"model": "m"}) is None


def test_a_long_shared_system_prompt_still_tells_conversations_apart() -> None:
    system = "You answer questions about our product catalogue. " * 60  # ~3000 characters
    assert conversation_prefix(_chat(system, "first question")) != conversation_prefix(_chat(system, "another"))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4_000_000}}
    with_image = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}]}
    assert len(conversation_prefix(with_image) or b"") < 2200  # the image's first KiB, not 4 MB


def test_ring_keeps_a_prefix_on_its_replica_while_loads_are_even() -> None:
    ring = Ring([A, B, C])
    prefix = b"conversation-17"
    own, is_own = ring.pick(prefix, {}, 1.25)
    assert is_own
    assert all(ring.pick(prefix, {A: 1, B: 1, C: 1}, 1.25) == (own, True) for _ in range(5))


def test_ring_spills_past_a_replica_over_the_load_bound() -> None:
    ring = Ring([A, B, C])
    prefix = b"conversation-17"
    own, _ = ring.pick(prefix, {}, 1.25)
    # 6 in flight, 3 replicas: with this request at most ceil(1.25 * 7 / 3) = 3 each.
    loads = dict.fromkeys([A, B, C], 0) | {own: 3}
    loads[next(r for r in (A, B, C) if r != own)] = 3
    spilled, is_own = ring.pick(prefix, loads, 1.25)
    assert spilled != own and not is_own and loads[spilled] == 0


def test_ring_spreads_prefixes_and_moves_few_when_a_replica_goes() -> None:
    three, two = Ring([A, B, C]), Ring([A, B])
    prefixes = [f"conversation-{i}".encode() for i in range(1500)]
    owners = [three.pick(p, {}, 1.25)[0] for p in prefixes]
    shares = Counter(owners)
    assert min(shares.values()) > 300, shares  # an even share is 500
    moved = [p for p, owner in zip(prefixes, owners, strict=True) if owner != C and two.pick(p, {}, 1.25)[0] != owner]
    assert not moved  # only C's conversations find a new replica


# --- the directory -------------------------------------------------------------------------------


def _pod(name: str, ip: str, ready: bool = True, terminating: bool = False, container_id: str = "cri://1") -> dict:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns"}
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    return {
        "metadata": metadata,
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "sidecar", "containerID": container_id, "state": {"running": {}}}],
        },
    }


def _modelserver(name: str, namespace: str = "ns", public: bool = False) -> dict:
    spec = {"auth": {"mode": "public"}} if public else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-11-23T00:00:00Z"},
        "spec": spec,
    }


def test_only_ready_running_pods_take_requests() -> None:
    pods = [
        _pod("b", "10.88.0.3"),
        _pod("a", "10.88.0.2"),
        _pod("loading", "10.88.0.5", ready=False),
        _pod("draining", "10.88.0.6", terminating=True),
        _pod("kwok", "10.0.0.9", container_id=""),  # simulated: nothing listens at its address
    ]
    model = model_of(_modelserver("m", public=True), pods)
    assert model.replicas == (A, B)
    assert model.pods == {A: "a", B: "b"}
    assert model.public and model.created == 1795392000
    assert model_of(_modelserver("m"), []).ring is None


def test_names_resolve_bare_or_by_namespace() -> None:
    directory = Directory()
    for namespace, name in (("team-a", "chat"), ("team-b", "chat"), ("team-a", "embed")):
        directory.put(Model(namespace, name, public=False))
    assert directory.resolve("embed").key == ("team-a", "embed")  # type: ignore[union-attr]
    assert directory.resolve("team-b/chat").key == ("team-b", "chat")  # type: ignore[union-attr]
    assert directory.resolve("nothing") is None
    with pytest.raises(Ambiguous) as ambiguous:
        directory.resolve("chat")
    assert ambiguous.value.namespaces == ["team-a", "team-b"]
    assert directory.listed_name(directory.models[("team-a", "chat")]) == "team-a/chat"
    directory.remove(("team-b", "chat"))
    assert directory.resolve("chat").key == ("team-a", "chat")  # type: ignore[union-attr]
    assert directory.listed_name(directory.models[("team-a", "chat")]) == "chat"


def test_adapters_resolve_to_their_base_and_are_listed_with_it() -> None:
    directory = Directory()
    served = _modelserver("base")
    served["spec"]["adapters"] = [{"name": "pirate", "source": "a/b"}, {"name": "chat", "source": "a/c"}]
    base = model_of(served, [_pod("p", "10.88.0.2")])
    directory.put(base)
    directory.put(Model("ns", "chat", public=False))  # a ModelServer's own name wins over an adapter's
    directory.put(Model("other", "pirate", public=False))
    assert directory.resolve("ns/pirate") is base and directory.resolve("ns/pirate:latest") is base
    assert served_name("ns/pirate:latest") == "pirate"
    with pytest.raises(Ambiguous):
        directory.resolve("pirate")
    assert directory.resolve("chat").key == ("ns", "chat")  # type: ignore[union-attr]
    objects = model_objects(directory, base)
    assert [(o["id"], o.get("parent")) for o in objects] == [("base", None), ("ns/pirate", "base")]
    assert [e["details"].get("parent_model") for e in ollama_entries(directory, base)] == [None, "base:latest"]
    # An adapter taken out of the spec is gone from the directory.
    served["spec"]["adapters"] = []
    directory.put(model_of(served, []))
    assert directory.resolve("ns/pirate") is None and directory.resolve("other/pirate") is not None
    directory.remove(("ns", "base"))
    assert directory.resolve("pirate").key == ("other", "pirate")  # type: ignore[union-attr]


def test_prefix_affinity_is_keyed_per_adapter() -> None:
    ring = Ring([A, B, C])
    prefix = conversation_prefix({"messages": [{"role": "user", "content": "hello"}]})
    assert prefix is not None
    assert affinity_key(prefix, "base", "base") == prefix
    keys = {affinity_key(prefix, name, "base") for name in ("a", "b", "c", "d", "e", "f")}
    assert len(keys) == 6 and prefix not in keys
    picks = {ring.pick(key, {}, 1.25, [])[0] for key in keys}
    assert len(picks) > 1  # one conversation opening on several adapters spreads over the replicas


# --- requests ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", "invalid_json"),
        (b"[1]", "invalid_json"),
        (b'{"messages": []}', "missing_model"),
        (b'{"model": 3}', "missing_model"),
    ],
)
def test_requests_without_a_model_are_refused_naming_it(body: bytes, code: str) -> None:
    _, refusal = parse_request(body)
    assert refusal is not None and refusal.status == 400 and refusal.code == code
    if code == "missing_model":
        assert refusal.param == "model"


@pytest.mark.parametrize("name", sorted(hostile_json()))
def test_hostile_json_is_refused_as_invalid_json_never_raised(name: str) -> None:
    request, refusal = parse_request(hostile_json()[name])
    assert request == {} and refusal is not None
    assert (refusal.status, refusal.code) == (400, "invalid_json")


def test_the_affinity_prefix_reads_only_strings_of_the_request() -> None:
    deep: list = []
    for _ in range(100_000):  # str() of it would raise RecursionError
        deep = [deep]
    request = {"messages": [{"role": deep, "content": [{"type": "text", "text": deep}]}]}
    assert conversation_prefix(request) == b"\x1f"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
    assert (
        conversation_prefix({"messages": [{"role": "user", "content": [image]}]})
        == b"user\x1fdata:image/png;base64,iVBO"
    )


def test_a_replica_is_asked_with_the_routes_own_method_and_path() -> None:
    """The method and path sent come from the route table, never the client's spelling (pipeline
    rule 5): a GET route is asked as a GET."""
    directory = Directory()
    directory.put(Model("ns", "m", True, replicas=("10.0.0.1:8080",)))
    proxy = GatewayProxy(GatewaySettings(), directory, Holding(2), GatewayMetrics())
    for method, path in (("POST", "/v1/chat/completions"), ("POST", "/api/chat"), ("GET", "/v1/models")):
        body = b"" if method == "GET" else b'{"model": "m"}'
        planned = proxy._plan(Exchange(0.0), method, path, [], body)
        if method == "GET":  # a GET with no body names no model: refused, never sent as a POST
            assert isinstance(planned, ErrorResponse)
            continue
        assert not isinstance(planned, ErrorResponse)
        assert (planned.route.method, planned.route.path) == (method, path)
        assert proxy.pick(planned, 0) == (f"http://10.0.0.1:8080{path}", False)


def test_a_request_with_a_model_passes() -> None:
    assert parse_request(b'{"model": "m", "stream": true}') == ({"model": "m", "stream": True}, None)


def test_a_request_without_a_key_passes_only_for_a_public_model() -> None:
    """No key: the sidecar's 401 for any model not known to be public, unknown ones included, and
    for a name a private model shares (its 400 would name the private model's namespace)."""
    directory = Directory()
    for model in (Model("pub", "open", True), Model("priv", "closed", False), Model("pub", "both", True)):
        directory.put(model)
    directory.put(Model("priv", "both", False))
    directory.put(Model("pub2", "open", True))
    proxy = GatewayProxy(GatewaySettings(), directory, Holding(2), GatewayMetrics())

    def plan(model: str, authorization: bytes | None) -> tuple[int, str] | str:
        headers = [(b"authorization", authorization)] if authorization is not None else []
        planned = proxy._plan(
            Exchange(0.0), "POST", "/v1/chat/completions", headers, f'{{"model": "{model}"}}'.encode()
        )
        return (planned.status, planned.code) if isinstance(planned, ErrorResponse) else planned.model.namespace

    missing = (401, unauthorized("missing").code)
    for authorization in (None, b"", b"  "):
        assert plan("pub/open", authorization) == "pub"
        assert plan("closed", authorization) == missing
        assert plan("nothing", authorization) == missing
        assert plan("both", authorization) == missing
        assert plan("open", authorization) == (400, "ambiguous_model")  # every one serving it is public
    assert plan("closed", b"Bearer made-up") == "priv"  # the replica's sidecar checks it
    assert plan("nothing", b"Bearer made-up") == (404, "model_not_found")
    assert plan("both", b"Bearer made-up") == (400, "ambiguous_model")


# --- keys ----------------------------------------------------------------------------------------


def test_what_an_answer_proves_of_a_key() -> None:
    assert keyless(None) and keyless(b"") and keyless(b" \t") and not keyless(b"Bearer x")
    assert proof(200) is True and proof(400) is True and proof(404) is True and proof(413) is True
    assert proof(401) is False
    # Answers a server may give before the sidecar checks the key say nothing of it.
    assert proof(503) is None and proof(500) is None and proof(429) is None and proof(408) is None
    assert proof(431) is None


def test_a_client_is_its_address_and_an_ipv6_one_its_64() -> None:
    assert client_bucket("10.1.2.3") == "10.1.2.3"
    assert client_bucket("2001:db8:1:2:aaaa::1") == client_bucket("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert client_bucket("2001:db8:1:3::1") != client_bucket("2001:db8:1:2::1")
    assert client_bucket("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_bucket(None) == client_bucket("") == ""


def test_a_full_memory_gives_up_its_oldest_entry_not_everything() -> None:
    recent: Recent[str, int] = Recent(max_entries=3)
    for i, name in enumerate("abc"):
        recent.put(name, i, float(i))
    recent.put("a", 10, 3.0)  # written again: the newest
    recent.put("d", 4, 4.0)
    assert len(recent) == 3 and recent.get("b") is None
    assert recent.get("a") == (3.0, 10) and recent.get("c") == (2.0, 2) and recent.get("d") == (4.0, 4)


def test_the_keys_seen_opening_a_model_are_remembered_for_a_week() -> None:
    opened = Opened(max_entries=2)
    good, other, model = digest(b"Bearer good"), digest(b"Bearer other"), ("ns", "m")
    opened.learn(good, model, proof(200), now=0.0)
    assert opened.opens(good, model, now=OPENED_MEMORY_SECONDS - 1)
    assert opened.opens_some(good, now=1.0) and not opened.opens_some(other, now=1.0)
    assert not opened.opens(good, model, now=OPENED_MEMORY_SECONDS + 1)
    assert not opened.opens(good, ("ns", "other"), now=1.0) and not opened.opens(other, model, now=1.0)
    opened.learn(good, model, proof(503), now=2.0)  # says nothing: still remembered, from 0
    assert opened.opens(good, model, now=OPENED_MEMORY_SECONDS - 1)
    opened.learn(good, model, proof(401), now=3.0)  # the key was revoked
    assert not opened.opens(good, model, now=4.0) and not opened.opens_some(good, now=4.0)
    for i in range(5):  # made-up keys cannot fill it: only a replica's answer puts one in
        opened.learn(digest(f"Bearer {i}".encode()), model, proof(401), now=5.0)
    assert len(opened) == 0


# --- holding -------------------------------------------------------------------------------------


def test_holding_wakes_times_out_fills_and_lets_go() -> None:
    async def scenario() -> None:
        counts: list[int] = []
        holding = Holding(max_held=2, on_count=lambda key, count: counts.append(count))
        key = ("ns", "m")
        never = asyncio.get_running_loop().create_future()
        first = asyncio.ensure_future(holding.wait(key, 10, never))
        second = asyncio.ensure_future(holding.wait(key, 10, never))
        await asyncio.sleep(0.01)
        assert holding.held() == {key: 2}
        assert await holding.wait(key, 10, never) is Outcome.FULL
        holding.wake(key)
        assert await first is Outcome.READY and await second is Outcome.READY
        assert holding.held() == {}
        assert await holding.wait(key, 0.05, never) is Outcome.TIMEOUT
        gone = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(holding.wait(key, 10, gone))
        await asyncio.sleep(0.01)
        gone.set_result(None)
        assert await waiting is Outcome.GONE
        assert holding.held() == {} and counts[-1] == 0
        never.cancel()

    asyncio.run(scenario())


def test_unverified_keys_wait_in_a_small_share_of_their_own() -> None:
    async def scenario() -> None:
        holding = Holding(max_held=2, max_unverified=3, max_unverified_per_client=2)
        key, other = ("ns", "m"), ("ns", "other")
        never = asyncio.get_running_loop().create_future()

        def hold(model: tuple[str, str], client: str | None) -> asyncio.Future[Outcome]:
            return asyncio.ensure_future(holding.wait(model, 10, never, client))

        waiting = [hold(key, "10.0.0.1"), hold(key, "10.0.0.1")]
        await asyncio.sleep(0.01)
        assert await holding.wait(key, 10, never, "10.0.0.1") is Outcome.FULL  # that client's two
        assert await holding.wait(other, 10, never, "10.0.0.1") is Outcome.FULL  # whatever the model
        waiting.append(hold(key, "10.0.0.2"))
        await asyncio.sleep(0.01)
        assert await holding.wait(key, 10, never, "10.0.0.3") is Outcome.FULL  # the model's three
        # Verified requests keep their own places, and all are demand.
        waiting += [hold(key, None), hold(key, None)]
        await asyncio.sleep(0.01)
        assert await holding.wait(key, 10, never) is Outcome.FULL
        assert holding.held() == {key: 5}
        holding.wake(key)
        assert [await w for w in waiting] == [Outcome.READY] * 5
        assert holding.held() == {} and holding.admits(key, "10.0.0.1") and holding.admits(other, "10.0.0.3")
        never.cancel()

    asyncio.run(scenario())


def test_held_counts_round_trip_and_add_up_across_gateway_pods() -> None:
    held = {("ns", "m"): 3, ("other", "x"): 1}
    assert held_from_json(held_to_json(held)) == held
    gateway = {
        "metadata": {"name": "g"},
        "status": {
            "podIP": "10.88.0.9",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "gateway", "containerID": "cri://2", "state": {"running": {}}}],
        },
    }
    unready = {**gateway, "status": {**gateway["status"], "conditions": []}}
    answers = {"10.88.0.9:8080": held, "10.88.0.10:8080": {("ns", "m"): 2}, "127.0.0.1:9000": {("ns", "m"): 1}}
    second = {**gateway, "status": {**gateway["status"], "podIP": "10.88.0.10"}}
    addresses = gateway_addresses([gateway, second, unready], ("127.0.0.1:9000",))
    assert addresses == ["10.88.0.9:8080", "10.88.0.10:8080", "127.0.0.1:9000"]
    # One serving HTTPS (its port named https, as the chart's gateway.tls names it) is read over TLS.
    https = {**second, "spec": {"containers": [{"name": "gateway", "ports": [{"name": "https"}]}]}}
    assert gateway_addresses([gateway, https]) == ["10.88.0.9:8080", "https://10.88.0.10:8080"]
    assert total_held(addresses, answers.__getitem__) == {("ns", "m"): 6, ("other", "x"): 1}


# --- settings ------------------------------------------------------------------------------------


def test_settings_name_the_bad_variable() -> None:
    assert GatewaySettings.from_env({"MODELSERVE_GATEWAY_NAMESPACES": "b, a,,a"}).namespaces == ("a", "b")
    with pytest.raises(ConfigError, match="MODELSERVE_GATEWAY_ROUTING"):
        GatewaySettings.from_env({"MODELSERVE_GATEWAY_ROUTING": "round-robin"})
    with pytest.raises(ConfigError, match="MODELSERVE_GATEWAY_AFFINITY_LOAD_FACTOR"):
        GatewaySettings.from_env({"MODELSERVE_GATEWAY_AFFINITY_LOAD_FACTOR": "0.5"})
    with pytest.raises(ConfigError, match="MODELSERVE_GATEWAY_HOLD_SECONDS"):
        GatewaySettings.from_env({"MODELSERVE_GATEWAY_HOLD_SECONDS": "0"})
    defaults = GatewaySettings.from_env({})
    assert (defaults.max_held_unverified, defaults.max_held_unverified_per_client, defaults.model_list_asks) == (
        8,
        2,
        16,
    )
    for variable in (
        "MODELSERVE_GATEWAY_MAX_HELD_UNVERIFIED",
        "MODELSERVE_GATEWAY_MAX_HELD_UNVERIFIED_PER_CLIENT",
        "MODELSERVE_GATEWAY_MODEL_LIST_ASKS",
    ):
        with pytest.raises(ConfigError, match=variable):
            GatewaySettings.from_env({variable: "0"})


def test_a_forgotten_model_leaves_no_series_and_counts_afresh() -> None:
    metrics = GatewayMetrics()
    kept, gone = ("default", "kept"), ("default", "gone")
    for key in (kept, gone):
        metrics.observe(key, "2xx", 0.2, 0.01)
        metrics.routed(key, "least_in_flight")
        metrics.enter(key)
    metrics.forget(gone)
    text = metrics.render().decode()
    assert 'model="gone"' not in text
    assert 'modelserve_gateway_requests_total{model="kept",namespace="default",status_class="2xx"} 1.0' in text
    assert 'modelserve_gateway_request_duration_seconds_count{model="kept",namespace="default"} 1.0' in text
    # Its cached children went with the series: a ModelServer of the same name counts from zero.
    metrics.observe(gone, "2xx", 0.2, None)
    text = metrics.render().decode()
    assert 'modelserve_gateway_requests_total{model="gone",namespace="default",status_class="2xx"} 1.0' in text
    assert 'modelserve_gateway_time_to_first_byte_seconds_count{model="gone",namespace="default"} 0.0' in text
