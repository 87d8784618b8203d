"""The sidecar (a real process) serves the consumer routes only: every other route of each pinned
engine (tests/fixtures/engine_routes, read from the engines' source) and every other spelling of an
allowed one is the sidecar's own 404 and never reaches the engine. The engine here is the replay
upstream, which answers 200 on any path and records every request it receives, so a request that
got through shows."""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import unquote

import httpx
import pytest

from harness.sidecar import (
    API_KEY,
    ENGINE_TABLES,
    MARK_HEADER,
    METHODS,
    SPELLED,
    RawAnswer,
    ReplayEngine,
    Sidecar,
    assert_refused_here,
    metric_value,
    raw_request,
    refused_counts,
    refused_routes,
)
from modelserve.contracts import routes
from modelserve.contracts.sidecar import OWN_ROUTES

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]
# A body every allowed POST route takes (chat, completions, responses, embeddings, tokenize, Ollama's).
ANY_BODY = json.dumps({"model": "tiny", "messages": HELLO, "prompt": "hi", "input": "hi"}).encode()


def send(base: str, method: str, target: str, mark: str) -> RawAnswer:
    body = ANY_BODY if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    headers = {**AUTH, "Content-Type": "application/json", MARK_HEADER: mark}
    return raw_request(base, method, target, headers, body)


@pytest.mark.parametrize("table", ENGINE_TABLES)
def test_every_engine_route_outside_the_allowlist_is_the_sidecars_404(
    table: str, replay: ReplayEngine, replay_sidecar: Sidecar
) -> None:
    # The sidecar's own routes (/metrics, /load) answer as they always did: not the engine's.
    refused = [route for route in refused_routes(table) if route["path"] not in OWN_ROUTES]
    before = refused_counts(replay_sidecar.metrics())
    for route in refused:
        answer = send(replay_sidecar.url, route["method"], route["path"], table)
        assert_refused_here(answer, route["method"], route["path"])
    assert replay.marked(table) == []
    counted = refused_counts(replay_sidecar.metrics())
    counted.subtract(before)
    assert +counted == Counter(route["class"] for route in refused)


def test_a_refused_route_needs_no_key_and_an_allowed_one_does(replay: ReplayEngine, replay_sidecar: Sidecar) -> None:
    mark = {MARK_HEADER: "no-key"}
    assert raw_request(replay_sidecar.url, "GET", "/slots", mark).status == 404
    assert raw_request(replay_sidecar.url, "GET", "/v1/models", mark).status == 401
    assert replay.marked("no-key") == []


@pytest.mark.parametrize("method", METHODS)
def test_any_method_and_spelling_is_refused_or_forwarded_as_checked(
    method: str, replay: ReplayEngine, replay_sidecar: Sidecar
) -> None:
    for i, target in enumerate(SPELLED):
        mark = f"{method}-{i}"
        answer = send(replay_sidecar.url, method, target, mark)
        decoded = unquote(target.partition("?")[0])
        arrived = replay.marked(mark)
        if routes.allowed(method, decoded) is None:
            assert_refused_here(answer, method, decoded)
            assert arrived == [], (method, target)
            continue
        # Allowed as decoded: the engine got the route's own path (an Ollama route: the one it
        # is translated to), never the client's spelling or query.
        assert answer.status < 500, (method, target, answer)
        assert arrived and all(p in routes.ALLOWED_PATHS for _, p in arrived), (method, target, arrived)
        if not decoded.startswith(routes.OLLAMA_PREFIX):
            assert arrived == [(method, decoded)], (method, target, arrived)


def test_every_allowed_post_route_gets_the_body_checks(replay: ReplayEngine, replay_sidecar: Sidecar) -> None:
    posts = sorted(path for (method, path) in routes.CONSUMER_ROUTES if method == "POST")
    headers = {**AUTH, "Content-Type": "application/json", MARK_HEADER: "malformed"}
    for path in posts:
        answer = raw_request(replay_sidecar.url, "POST", path, headers, b'{"model": ')
        assert answer.status == 400, (path, answer)
    assert replay.marked("malformed") == []


def test_responses_are_never_stored_and_get_the_sampling_defaults(
    replay: ReplayEngine, replay_sidecar: Sidecar
) -> None:
    request = {"model": "tiny", "input": "hi", "store": True}
    answer = httpx.post(replay_sidecar.url + "/v1/responses", json=request, headers=AUTH, timeout=30)
    assert answer.status_code == 200 and answer.json()["reached"] == "engine"
    sent = {**request, "store": False, "temperature": 0.1, "top_k": 50, "max_output_tokens": 8}
    assert replay.received[-1] == sent


def test_refusals_are_neither_demand_nor_proxied_requests(replay_sidecar: Sidecar) -> None:
    before_load = httpx.get(replay_sidecar.url + "/load", timeout=10).json()
    before = replay_sidecar.metrics()
    send(replay_sidecar.url, "POST", "/update_weights_from_disk", "demand")
    after = replay_sidecar.metrics()
    assert httpx.get(replay_sidecar.url + "/load", timeout=10).json()["arrivals"] == before_load["arrivals"]
    other = 'modelserve_sidecar_requests_total{route="other",status_class="4xx"}'
    assert metric_value(after, other) == metric_value(before, other) == 0
