"""The sidecar (a real process) serves the consumer routes only: every other route of each pinned
engine (tests/fixtures/engine_routes, read from the engines' source) and every other spelling of an
allowed one is the sidecar's own 404 and never reaches the engine. The engine here is the replay
upstream, which answers 200 on any path and records every request it receives, so a request that
got through shows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from sidecar_harness import (
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
    launch_sidecar,
    metric_value,
    raw_request,
    refused_counts,
    refused_routes,
    start_replay,
    stop_process,
    wait_ready,
)

from modelserve_sidecar import routes
from modelserve_sidecar.contract import OWN_ROUTES

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]
# A body every allowed POST route takes (chat, completions, responses, embeddings, tokenize, Ollama's).
ANY_BODY = json.dumps({"model": "tiny", "messages": HELLO, "prompt": "hi", "input": "hi"}).encode()


@pytest.fixture(scope="module")
def engine() -> Iterator[ReplayEngine]:
    replay = start_replay()
    yield replay
    replay.stop()


@pytest.fixture(scope="module")
def sidecar(engine: ReplayEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    base: Path = tmp_path_factory.mktemp("allowlist")
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    defaults = json.dumps({"temperature": 0.1, "max_tokens": 8})
    running = launch_sidecar(
        base / "logs",
        engine.url,
        "tiny",
        {"MODELSERVE_KEYS_DIR": str(base / "keys"), "MODELSERVE_SAMPLING_DEFAULTS": defaults},
    )
    try:
        wait_ready(running)
        yield running
    finally:
        stop_process(running.process)


def send(base: str, method: str, target: str, mark: str) -> RawAnswer:
    body = ANY_BODY if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    headers = {**AUTH, "Content-Type": "application/json", MARK_HEADER: mark}
    return raw_request(base, method, target, headers, body)


@pytest.mark.parametrize("table", ENGINE_TABLES)
def test_every_engine_route_outside_the_allowlist_is_the_sidecars_404(
    table: str, engine: ReplayEngine, sidecar: Sidecar
) -> None:
    # The sidecar's own routes (/metrics, /load) answer as they always did: not the engine's.
    refused = [route for route in refused_routes(table) if route["path"] not in OWN_ROUTES]
    before = refused_counts(sidecar.metrics())
    for route in refused:
        answer = send(sidecar.url, route["method"], route["path"], table)
        assert_refused_here(answer, route["method"], route["path"])
    assert engine.marked(table) == []
    counted = refused_counts(sidecar.metrics())
    counted.subtract(before)
    assert +counted == Counter(route["class"] for route in refused)


def test_a_refused_route_needs_no_key_and_an_allowed_one_does(engine: ReplayEngine, sidecar: Sidecar) -> None:
    mark = {MARK_HEADER: "no-key"}
    assert raw_request(sidecar.url, "GET", "/slots", mark).status == 404
    assert raw_request(sidecar.url, "GET", "/v1/models", mark).status == 401
    assert engine.marked("no-key") == []


@pytest.mark.parametrize("method", METHODS)
def test_any_method_and_spelling_is_refused_or_forwarded_as_checked(
    method: str, engine: ReplayEngine, sidecar: Sidecar
) -> None:
    for i, target in enumerate(SPELLED):
        mark = f"{method}-{i}"
        answer = send(sidecar.url, method, target, mark)
        decoded = unquote(target.partition("?")[0])
        arrived = engine.marked(mark)
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


def test_every_allowed_post_route_gets_the_body_checks(engine: ReplayEngine, sidecar: Sidecar) -> None:
    posts = sorted(path for (method, path) in routes.CONSUMER_ROUTES if method == "POST")
    headers = {**AUTH, "Content-Type": "application/json", MARK_HEADER: "malformed"}
    for path in posts:
        answer = raw_request(sidecar.url, "POST", path, headers, b'{"model": ')
        assert answer.status == 400, (path, answer)
    assert engine.marked("malformed") == []


def test_responses_are_never_stored_and_get_the_sampling_defaults(engine: ReplayEngine, sidecar: Sidecar) -> None:
    request = {"model": "tiny", "input": "hi", "store": True}
    answer = httpx.post(sidecar.url + "/v1/responses", json=request, headers=AUTH, timeout=30)
    assert answer.status_code == 200 and answer.json()["reached"] == "engine"
    sent = {**request, "store": False, "temperature": 0.1, "max_output_tokens": 8}
    assert engine.received[-1] == sent


def test_refusals_are_neither_demand_nor_proxied_requests(sidecar: Sidecar) -> None:
    before_load = httpx.get(sidecar.url + "/load", timeout=10).json()
    before = sidecar.metrics()
    send(sidecar.url, "POST", "/update_weights_from_disk", "demand")
    after = sidecar.metrics()
    assert httpx.get(sidecar.url + "/load", timeout=10).json()["arrivals"] == before_load["arrivals"]
    other = 'modelserve_sidecar_requests_total{route="other",status_class="4xx"}'
    assert metric_value(after, other) == metric_value(before, other) == 0
