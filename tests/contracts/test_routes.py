"""The consumer-route allowlist (routes.py) against each pinned engine's route table, read from the
engine's source and kept in tests/fixtures/engine_routes (pure: no processes)."""

from __future__ import annotations

import pytest

from harness.sidecar import ENGINE_TABLES, engine_routes
from modelserve.contracts import routes


@pytest.mark.parametrize("table", ENGINE_TABLES)
def test_each_engine_route_is_allowed_or_refused_in_its_class(table: str) -> None:
    wrong = []
    for route in engine_routes(table):
        allowed = routes.allowed(route["method"], route["path"])
        got = "consumer" if allowed else routes.refusal_class(route["path"])
        if got != route["class"] and not (allowed is None and got == routes.WRONG_METHOD):
            wrong.append(f"{route['method']} {route['path']} ({route['source']}): {got}, table says {route['class']}")
    assert not wrong, "\n".join(wrong)


def test_every_consumer_route_is_an_engine_route_or_ollamas() -> None:
    served = {(r["method"], r["path"]) for table in ENGINE_TABLES for r in engine_routes(table)}
    for key, route in routes.CONSUMER_ROUTES.items():
        assert key in served or route.path.startswith(routes.OLLAMA_PREFIX), key


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", routes.WRONG_METHOD),  # asked for with GET, HEAD, ...
        ("//v1/chat/completions", routes.SPELLING),
        ("/v1/chat/completions/", routes.SPELLING),
        ("/v1/./chat/completions", routes.SPELLING),
        ("/v1/x/../chat/completions", routes.SPELLING),
        ("/V1/Chat/Completions", routes.SPELLING),
        ("/SLOTS", routes.SPELLING),
        ("/v1/chat/../../slots", routes.SPELLING),
        ("/slots", routes.ENGINE_ADMIN),
        ("/slots/3", routes.ENGINE_ADMIN),
        ("/metrics/anything", routes.ENGINE_ADMIN),
        ("/update_weights_from_disk", routes.ENGINE_ADMIN),
        ("/completion", routes.ENGINE_ALIAS),
        ("/v1/responses/resp_1", routes.ENGINE_ALIAS),
        ("/api/pull", routes.UNKNOWN),
        ("/etc/passwd", routes.UNKNOWN),
    ],
)
def test_refusal_classes(path: str, expected: str) -> None:
    assert routes.refusal_class(path) == expected


def test_allowed_needs_the_exact_method_and_path() -> None:
    assert routes.allowed("POST", "/v1/chat/completions") is routes.CHAT
    for method, path in [
        ("GET", "/v1/chat/completions"),
        ("HEAD", "/v1/models"),
        ("OPTIONS", "/v1/chat/completions"),
        ("post", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions/"),
        ("POST", "/v1//chat/completions"),
        ("POST", "/V1/chat/completions"),
        ("POST", "/v1/chat/completions\x00"),
        ("GET", "/api/chat"),
    ]:
        assert routes.allowed(method, path) is None, (method, path)


def test_only_openai_routes_are_forwarded_as_they_are() -> None:
    assert {path for _, path in routes.FORWARDED} == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/models",
        "/tokenize",
        "/detokenize",
    }


def test_errors_under_api_are_ollamas_in_any_spelling() -> None:
    assert routes.error_shape("/api/chat") == routes.OLLAMA
    assert routes.error_shape("/API//pull") == routes.OLLAMA
    assert routes.error_shape("/v1/chat/completions") == routes.OPENAI
    assert routes.error_shape("/apiary") == routes.OPENAI
