"""The sidecar's adapter parts that need no engine: the engine's words from a refusal, the mounted
list, the request's `model` as the engine wants it, Ollama's list with adapters, and the routes no
client reaches. The loop against a real vLLM: tests/realnode/test_lora_on_node.py."""

from __future__ import annotations

import json
from pathlib import Path

from modelserve.contracts import routes
from modelserve.contracts.adapters import ENGINE_ROUTES, AdapterApi, Desired, render_desired
from modelserve.http import ollama
from modelserve.sidecar.adapters import engine_message, read_desired
from modelserve.sidecar.request_checks import check_body


def test_the_engines_own_words_from_a_refusal() -> None:
    vllm = {"error": {"message": "The lora adapter 'x' already exists.", "type": "BadRequestError", "code": 400}}
    assert engine_message(400, json.dumps(vllm)) == "The lora adapter 'x' already exists."
    sglang = {"success": False, "error_message": "LoRA adapter x not found"}
    assert engine_message(400, json.dumps(sglang)) == "LoRA adapter x not found"
    assert engine_message(500, "Internal Server Error\n") == "engine answered 500: Internal Server Error"
    assert len(engine_message(400, json.dumps({"error": {"message": "x" * 5000}}))) == 500


def test_the_mounted_list(tmp_path: Path) -> None:
    path = tmp_path / "adapters.json"
    assert read_desired(path) == ()  # not mounted (yet): nothing wanted
    path.write_text(render_desired([Desired("pirate", "acme/pirate"), Desired("poet", "/cache/poet")]))
    assert read_desired(path) == (Desired("pirate", "acme/pirate"), Desired("poet", "/cache/poet"))
    path.write_text('{"pirate": "acme/pirate"}')
    assert read_desired(path) is None  # unreadable now: the last list stays


def test_sglang_is_asked_for_base_colon_adapter_and_vllm_for_the_name() -> None:
    body = json.dumps({"model": "pirate", "messages": [{"role": "user", "content": "hi"}]}).encode()
    sent = json.loads(check_body(routes.CHAT, body, "base", False, {}, {}, "", {"pirate": "base:pirate"}))
    assert sent["model"] == "base:pirate"
    assert check_body(routes.CHAT, body, "base", False, {}, {}, "", {"pirate": "pirate"}) is body
    base = json.dumps({"model": "base", "messages": []}).encode()
    assert check_body(routes.CHAT, base, "base", False, {}, {}, "", {"pirate": "base:pirate"}) is base
    assert ENGINE_ROUTES[AdapterApi.SGLANG].base_prefixed and not ENGINE_ROUTES[AdapterApi.VLLM].base_prefixed


def test_ollama_lists_the_adapters_the_engine_lists_with_their_base() -> None:
    models = {
        "data": [
            {"id": "base", "object": "model", "parent": None},
            {"id": "pirate", "object": "model", "root": "/cache/snapshots/abc", "parent": "base"},
            {"id": "stranger", "object": "model", "parent": "other"},
        ]
    }
    listed = ollama.tags_answer(models, "base")["models"]
    assert [(m["name"], m["details"].get("parent_model")) for m in listed] == [
        ("base:latest", ""),
        ("pirate:latest", "base:latest"),
    ]


def test_ollama_clients_ask_for_an_adapter_by_its_name() -> None:
    body = json.dumps({"model": "pirate:latest", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    planned = ollama.plan(ollama.CHAT_ROUTE, body.encode(), "base", ("pirate",))
    assert isinstance(planned, ollama.Plan) and json.loads(planned.body)["model"] == "pirate"
    assert planned.model == "pirate:latest"
    refused = ollama.plan(ollama.CHAT_ROUTE, body.encode(), "base")
    assert isinstance(refused, ollama.Refusal) and refused.status == 404
    shown = ollama.plan(ollama.SHOW_ROUTE, b'{"model": "pirate"}', "base", ("pirate",))
    assert isinstance(shown, ollama.Plan)


def test_no_client_reaches_an_engines_adapter_route() -> None:
    for engine_routes in ENGINE_ROUTES.values():
        for path in (engine_routes.load, engine_routes.unload):
            assert routes.allowed("POST", path) is None, path
    assert routes.allowed("POST", "/load_lora_adapter_from_tensors") is None
