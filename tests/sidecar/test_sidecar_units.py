"""Unit tests of the sidecar's pure parts (no processes, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.sidecar import (
    API_KEY,
    IMAGE_MESSAGES,
    SecretDir,
    hostile_json,
    read_recording,
)
from modelserve.contracts import routes
from modelserve.contracts.env import ConfigError
from modelserve.contracts.sidecar import Settings
from modelserve.http import errors, json_body
from modelserve.http.downstream import Exchange
from modelserve.http.json_body import NESTED_TOO_DEEPLY, BadJson, encode, parse
from modelserve.http.usage import ResponseTail, usage_from_tail
from modelserve.sidecar.auth import extract_key, identify
from modelserve.sidecar.keys import KeyStore, key_files
from modelserve.sidecar.metrics import SidecarMetrics, route_label
from modelserve.sidecar.proxy import DROP_TO_ENGINE, HOP_BY_HOP, Proxy, filter_headers
from modelserve.sidecar.readiness import listed_models
from modelserve.sidecar.request_checks import check_body, missing_sampling, request_model

REQUIRED = {"MODELSERVE_UPSTREAM_URL": "http://127.0.0.1:8000/", "MODELSERVE_SERVED_MODEL": "tiny"}


# --- config -----------------------------------------------------------------------------------------


def test_settings_defaults_follow_the_contract() -> None:
    s = Settings.from_env(REQUIRED)
    assert s.upstream_url == "http://127.0.0.1:8000"  # trailing slash dropped: paths are appended
    assert (s.listen_host, s.listen_port) == ("0.0.0.0", 8080)
    assert (s.engine_health_path, s.engine_metrics_path) == ("/health", "/metrics")
    assert s.engine_probe_timeout_seconds == 5.0
    assert s.auth_public is False and s.metrics_public is True and s.vision is False
    assert s.keys_dir == Path("/etc/modelserve/keys")
    assert dict(s.sampling_defaults) == {}
    assert (s.max_body_bytes, s.upstream_timeout_seconds, s.drain_seconds) == (10485760, 600.0, 60.0)


def test_settings_parse_every_variable() -> None:
    s = Settings.from_env(
        {
            **REQUIRED,
            "MODELSERVE_AUTH": "public",
            "MODELSERVE_METRICS_PUBLIC": "false",
            "MODELSERVE_VISION": "true",
            "MODELSERVE_LISTEN_PORT": "9000",
            "MODELSERVE_SAMPLING_DEFAULTS": '{"temperature": 0.1, "top_k": 50, "max_tokens": 512}',
            "MODELSERVE_DRAIN_SECONDS": "0",
            "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS": "2.5",
            "MODELSERVE_ENGINE_PROBE_TIMEOUT_SECONDS": "25",
        }
    )
    assert s.auth_public and not s.metrics_public and s.vision and s.listen_port == 9000
    assert dict(s.sampling_defaults) == {"temperature": 0.1, "top_k": 50, "max_tokens": 512}
    assert isinstance(s.sampling_defaults["top_k"], int)
    assert (s.drain_seconds, s.upstream_timeout_seconds, s.engine_probe_timeout_seconds) == (0.0, 2.5, 25.0)
    with pytest.raises(TypeError):
        s.sampling_defaults["top_p"] = 1.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MODELSERVE_SERVED_MODEL": "tiny"}, "MODELSERVE_UPSTREAM_URL is required"),
        ({"MODELSERVE_UPSTREAM_URL": "http://x"}, "MODELSERVE_SERVED_MODEL is required"),
        (
            {**REQUIRED, "MODELSERVE_UPSTREAM_URL": "127.0.0.1:8000"},
            "MODELSERVE_UPSTREAM_URL='127.0.0.1:8000': must be an http(s) URL",
        ),
        ({**REQUIRED, "MODELSERVE_LISTEN_PORT": "http"}, "MODELSERVE_LISTEN_PORT='http': must be an integer"),
        ({**REQUIRED, "MODELSERVE_LISTEN_PORT": "70000"}, "MODELSERVE_LISTEN_PORT='70000': must be a port"),
        ({**REQUIRED, "MODELSERVE_AUTH": "none"}, "MODELSERVE_AUTH='none': must be 'private' or 'public'"),
        ({**REQUIRED, "MODELSERVE_VISION": "maybe"}, "MODELSERVE_VISION='maybe': must be true or false"),
        (
            {**REQUIRED, "MODELSERVE_ENGINE_HEALTH_PATH": "health"},
            "MODELSERVE_ENGINE_HEALTH_PATH='health': must be a path",
        ),
        ({**REQUIRED, "MODELSERVE_MAX_BODY_BYTES": "0"}, "MODELSERVE_MAX_BODY_BYTES='0': must be a positive integer"),
        (
            {**REQUIRED, "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS": "-1"},
            "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS='-1': must be a positive",
        ),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": "{"}, "MODELSERVE_SAMPLING_DEFAULTS='{': not valid JSON"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": "[1]"}, "must be a JSON object"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"seed": 1}'}, "unknown field(s) seed"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"temperature": "hot"}'}, "temperature must be a number"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"top_k": 1.5}'}, "top_k must be an integer"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"max_tokens": 0}'}, "max_tokens must be positive"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"stop": "x"}'}, "stop must be a list of non-empty strings"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"stop": [""]}'}, "stop must be a list of non-empty strings"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_ALIASES": '{"repetition_penalty": 1}'}, "must be a JSON object of field"),
        ({**REQUIRED, "MODELSERVE_SAMPLING_ALIASES": '{"seed": "s"}'}, "unknown field(s) seed"),
    ],
)
def test_settings_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert message in str(caught.value)


# --- auth and keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, (None, "missing")),
        (b"", (None, "missing")),
        (b"Bearer abc", (b"abc", None)),
        (b"bearer abc", (b"abc", None)),
        (b"Key abc", (b"abc", None)),
        (b"KEY   abc ", (b"abc", None)),
        (b"Basic abc", (None, "malformed")),
        (b"Bearer", (None, "malformed")),
        (b"abc", (None, "malformed")),
        (b"Bearer a b", (None, "malformed")),
    ],
)
def test_extract_key(header: bytes | None, expected: tuple[bytes | None, str | None]) -> None:
    assert extract_key(header) == expected


def test_key_store_reads_a_secret_mount_and_follows_updates(tmp_path: Path) -> None:
    secret = SecretDir(tmp_path / "keys")
    secret.write({"api-key": f"{API_KEY}\n", "other": "second-key\n\n"})
    assert [p.name for p in key_files(secret.path)] == ["api-key", "other"]  # ..data etc. skipped
    store = KeyStore(secret.path)
    assert len(store) == 2 and store.matches(API_KEY.encode()) and store.matches(b"second-key")
    assert not store.matches(b"second") and not store.matches(b"")
    assert store.reload_if_changed() is False  # nothing changed, nothing re-read

    secret.write({"api-key": "rotated\n"})
    assert store.reload_if_changed() is True
    assert store.matches(b"rotated") and not store.matches(API_KEY.encode()) and len(store) == 1


def test_key_store_without_a_directory_refuses_everything(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "absent")
    assert len(store) == 0 and not store.matches(b"anything")


def test_identify_says_why_a_key_is_refused(tmp_path: Path) -> None:
    secret = SecretDir(tmp_path / "keys")
    secret.write({"api-key": API_KEY})
    store = KeyStore(secret.path)
    assert identify([(b"authorization", f"Bearer {API_KEY}".encode())], store, 0)[1] is None
    assert identify([(b"authorization", f"key {API_KEY}".encode())], store, 0)[1] is None
    assert identify([(b"authorization", b"Bearer wrong")], store, 0)[1] == "invalid"
    assert identify([(b"authorization", b"Token x")], store, 0)[1] == "malformed"
    assert identify([(b"accept", b"*/*")], store, 0)[1] == "missing"


def test_unauthorized_is_openai_shaped_with_a_challenge() -> None:
    refused = errors.unauthorized("invalid")
    body = json.loads(refused.body())
    assert body == {
        "error": {
            "message": "Invalid API key.",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    names = [name for name, _ in refused.headers(refused.body())]
    assert b"www-authenticate" in names and refused.status == 401


# --- request checks --------------------------------------------------------------------------------

CHAT = routes.CHAT


def test_check_body_refuses_invalid_json_and_non_objects() -> None:
    refused = check_body(CHAT, b'{"model":"tiny","messages":[', "tiny", False, {})
    assert isinstance(refused, errors.ErrorResponse) and refused.status == 400
    assert refused.code == "invalid_json" and "not valid JSON" in refused.message
    assert isinstance(check_body(CHAT, b"[]", "tiny", False, {}), errors.ErrorResponse)
    assert isinstance(check_body(CHAT, b"\xff\xfe", "tiny", False, {}), errors.ErrorResponse)


@pytest.mark.parametrize("name", sorted(hostile_json()))
def test_hostile_json_is_refused_as_invalid_json_never_raised(name: str) -> None:
    body = hostile_json()[name]
    for route in (CHAT, routes.RESPONSES, routes.EMBEDDINGS):
        refused = check_body(route, body, "tiny", False, {"temperature": 0.1})
        assert isinstance(refused, errors.ErrorResponse), (route, name)
        assert (refused.status, refused.code) == (400, "invalid_json")
        assert "sys." not in refused.message  # says what is wrong, not how Python's limit is set
    assert request_model(body) is None


def test_json_body_reads_and_writes_without_raising() -> None:
    assert parse(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    assert parse(b"[" * 100_000) == BadJson(NESTED_TOO_DEEPLY)
    assert parse(b"1" * 5000) == BadJson("a number has more than 4300 digits")
    assert isinstance(parse(b'{"a":'), BadJson) and isinstance(parse(b"\xff"), BadJson)
    assert encode({"a": [1]}) == b'{"a": [1]}'
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert encode(deep) == BadJson(NESTED_TOO_DEEPLY)


def test_check_body_leaves_unchanged_bodies_alone() -> None:
    body = b'{"model": "tiny", "messages": [], "temperature": 1}'
    assert check_body(CHAT, body, "tiny", False, {"temperature": 0.1}) is body  # byte-for-byte


def test_image_part_to_a_text_model_is_refused_in_vllms_words() -> None:
    body = json.dumps(
        {
            "model": "tiny",
            "messages": IMAGE_MESSAGES,
        }
    ).encode()
    refused = check_body(CHAT, body, "tiny", False, {})
    vllm = json.loads(read_recording("err_image_text_model.http").body)["error"]
    assert isinstance(refused, errors.ErrorResponse)
    assert (refused.status, refused.message) == (vllm["code"], vllm["message"])
    assert check_body(CHAT, body, "tiny", True, {}) is body  # a vision model takes it


@pytest.mark.parametrize(
    ("field", "turn"),
    [
        ("messages", {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}]}),
        ("messages", {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "http://x/a.wav"}}]}),
        ("messages", {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg=="}}]}),
        ("messages", {"role": "user", "content": [{"type": "file", "file": {"file_data": "JVBERi0="}}]}),
        ("messages", {"role": "user", "content": [{"type": "image", "image": "data:image/png;base64,iVBO"}]}),
        ("messages", {"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}),
        # vLLM reads a part without a type by the media field it carries
        ("messages", {"role": "user", "content": [{"image_url": {"url": "data:image/png;base64,iVBO"}}]}),
        # one part as the content, not in a list
        ("messages", {"role": "user", "content": {"type": "image_url", "image_url": {"url": "http://x/i.png"}}}),
        # the Responses API: `input` items whose content lists parts
        ("input", {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/i.png"}]}),
        ("input", {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}),
        ("input", {"role": "user", "content": {"type": "input_image", "image_url": "http://x/i.png"}}),
    ],
)
def test_every_media_part_to_a_text_model_is_refused_in_vllms_words(field: str, turn: dict) -> None:
    body = json.dumps({"model": "tiny", field: [{"role": "user", "content": "hi"}, turn]}).encode()
    refused = check_body(routes.RESPONSES if field == "input" else CHAT, body, "tiny", False, {})
    assert isinstance(refused, errors.ErrorResponse)
    assert (refused.status, refused.message, refused.param) == (400, "tiny is not a multimodal model", field)
    assert check_body(CHAT, body, "tiny", True, {}) is body  # a vision model takes it


def test_text_parts_and_odd_part_types_pass_the_media_check() -> None:
    text = [{"type": "text", "text": "hi"}, {"type": "input_text", "text": "hi"}, "plain", 3]
    for field in ("messages", "input"):
        body = json.dumps({field: [{"role": "user", "content": text}], "model": "tiny"}).encode()
        assert check_body(CHAT, body, "tiny", False, {}) is body
    # A type that is not a string (unhashable) is no media type, and never a TypeError.
    odd = json.dumps({"messages": [{"role": "user", "content": [{"type": ["image_url"]}, {"type": {}}]}]}).encode()
    assert check_body(CHAT, odd, "tiny", False, {}) is odd


def test_sampling_defaults_fill_only_what_is_left_out() -> None:
    defaults = {"temperature": 0.1, "top_k": 50, "max_tokens": 512}
    body = json.dumps({"model": "tiny", "prompt": "hi", "temperature": 0.7, "top_k": None}).encode()
    sent = json.loads(check_body(routes.COMPLETIONS, body, "tiny", False, defaults))
    assert sent == {"model": "tiny", "prompt": "hi", "temperature": 0.7, "top_k": 50, "max_tokens": 512}
    # max_completion_tokens is the newer name of max_tokens: the client's choice stands.
    assert missing_sampling({"max_completion_tokens": 10}, defaults) == {"temperature": 0.1, "top_k": 50}
    # Embeddings do not sample.
    embed = b'{"model": "tiny", "input": "hi"}'
    assert check_body(routes.EMBEDDINGS, embed, "tiny", False, defaults) is embed


def test_a_stop_default_fills_only_a_request_without_stop() -> None:
    defaults = {"stop": ["<|im_end|>", "<|endoftext|>"]}
    filled = json.loads(check_body(CHAT, b'{"messages": []}', "tiny", False, defaults))
    assert filled["stop"] == ["<|im_end|>", "<|endoftext|>"]
    own = b'{"messages": [], "stop": "END"}'
    assert check_body(CHAT, own, "tiny", False, defaults) is own  # the client's stop replaces the list
    assert Settings.from_env({**REQUIRED, "MODELSERVE_SAMPLING_DEFAULTS": '{"stop": ["a"]}'}).sampling_defaults == {
        "stop": ["a"]
    }


def test_an_upstream_model_replaces_the_clients_model_on_every_json_route() -> None:
    # Profile external: the server knows the model by its own id, clients by the ModelServer's name.
    chat_body = b'{"model": "qwen3-mlx", "messages": []}'
    sent = json.loads(check_body(CHAT, chat_body, "qwen3-mlx", False, {}, {}, "llama3.2:1b"))
    assert sent == {"model": "llama3.2:1b", "messages": []}
    embed = json.loads(check_body(routes.EMBEDDINGS, b'{"input": "hi"}', "qwen3-mlx", False, {}, {}, "nomic"))
    assert embed["model"] == "nomic"
    same = b'{"model": "llama3.2:1b", "messages": []}'
    assert check_body(CHAT, same, "qwen3-mlx", False, {}, {}, "llama3.2:1b") is same
    assert check_body(CHAT, chat_body, "qwen3-mlx", False, {}) is chat_body  # an engine: as sent


def test_the_engine_model_is_the_upstream_model_or_the_served_name() -> None:
    assert Settings.from_env(REQUIRED).engine_model == "tiny"
    external = Settings.from_env({**REQUIRED, "MODELSERVE_UPSTREAM_MODEL": "llama3.2:1b"})
    assert external.engine_model == "llama3.2:1b" and external.served_model == "tiny"
    assert Settings.from_env({**REQUIRED, "MODELSERVE_ENGINE_METRICS": "false"}).engine_metrics is False


LLAMA_CPP_ALIASES = {"repetition_penalty": "repeat_penalty"}


def test_aliases_copy_a_clients_value_to_the_engines_own_name() -> None:
    body = json.dumps({"model": "tiny", "messages": [], "repetition_penalty": 1.3}).encode()
    sent = json.loads(check_body(CHAT, body, "tiny", False, {}, LLAMA_CPP_ALIASES))
    assert (sent["repetition_penalty"], sent["repeat_penalty"]) == (1.3, 1.3)
    # Without aliases (vLLM, SGLang) the body is left byte for byte.
    assert check_body(CHAT, body, "tiny", False, {}) is body


def test_aliases_copy_a_default_and_never_overwrite_the_engines_name() -> None:
    defaults = {"repetition_penalty": 1.05}
    filled = json.loads(check_body(CHAT, b'{"messages": []}', "tiny", False, defaults, LLAMA_CPP_ALIASES))
    assert (filled["repetition_penalty"], filled["repeat_penalty"]) == (1.05, 1.05)
    own = b'{"messages": [], "repeat_penalty": 1.2}'
    kept = json.loads(check_body(CHAT, own, "tiny", False, defaults, LLAMA_CPP_ALIASES))
    assert (kept["repetition_penalty"], kept["repeat_penalty"]) == (1.05, 1.2)
    # Nothing to copy: the body passes unchanged.
    plain = b'{"messages": []}'
    assert check_body(CHAT, plain, "tiny", False, {}, LLAMA_CPP_ALIASES) is plain


def test_every_post_consumer_route_gets_the_same_json_and_image_checks() -> None:
    posts = [route for route in routes.CONSUMER_ROUTES.values() if route.method == "POST" and route.path[:5] != "/api/"]
    assert {route.path for route in posts} == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    }
    image = json.dumps({"model": "tiny", "messages": IMAGE_MESSAGES}).encode()
    for route in posts:
        for refused in (b"[1]", b"not json", image):
            answer = check_body(route, refused, "tiny", False, {})
            assert isinstance(answer, errors.ErrorResponse) and answer.status == 400, (route, refused)


def test_responses_get_defaults_under_their_own_names_and_are_never_stored() -> None:
    defaults = {"temperature": 0.1, "max_tokens": 64}
    sent = json.loads(check_body(routes.RESPONSES, b'{"model": "tiny", "input": "hi"}', "tiny", False, defaults))
    assert sent == {"model": "tiny", "input": "hi", "temperature": 0.1, "max_output_tokens": 64, "store": False}
    stored = json.loads(
        check_body(routes.RESPONSES, b'{"input": "hi", "store": true, "max_output_tokens": 5}', "t", False, defaults)
    )
    assert (stored["store"], stored["max_output_tokens"]) == (False, 5)
    # Tokenizing neither samples nor stores: the body passes as sent.
    tokenize = b'{"model": "tiny", "prompt": "hi"}'
    assert check_body(routes.TOKENIZE, tokenize, "tiny", False, defaults) is tokenize


# --- usage, headers, models, metrics ---------------------------------------------------------------


def test_usage_from_recorded_vllm_answers() -> None:
    assert usage_from_tail(read_recording("chat.http").body) == (28, 8)
    assert usage_from_tail(read_recording("completions.http").body) == (3, 4)
    assert usage_from_tail(read_recording("chat_stream_usage.http").body) == (14, 6)
    assert usage_from_tail(read_recording("chat_stream.http").body) is None  # no usage asked for


def test_usage_from_tail_takes_the_last_real_usage_object() -> None:
    # Chunks with `"usage": null`, a cut-off start, and the word in generated text are skipped.
    stream = (
        b'ge": {"prompt_tokens": 99}}\n\n'
        b'data: {"choices": [{"delta": {"content": "\\"usage\\": 5"}}], "usage": null}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 14, "completion_tokens": 6}}\n\n'
        b'data: {"choices": [{"delta": {"content": "usage"}}], "usage" : null}\n\ndata: [DONE]\n\n'
    )
    assert usage_from_tail(stream) == (14, 6)
    assert usage_from_tail(b'{"usage": {"prompt_tokens": "many"}}') is None
    assert usage_from_tail(b"{not json") is None


def test_usage_of_responses_and_embeddings() -> None:
    completed = (
        b'event: response.completed\ndata: {"type": "response.completed", "response": {"id": "resp_1", '
        b'"usage": {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7, '
        b'"total_tokens": 18}}}\n\n'
    )
    assert usage_from_tail(completed) == (11, 7)
    assert usage_from_tail(b'{"data": [], "usage": {"prompt_tokens": 4, "total_tokens": 4}}') == (4, 0)


def test_response_tail_keeps_the_end_of_a_long_stream() -> None:
    stream = read_recording("chat_stream_usage.http").body
    tail = ResponseTail(limit=len(stream))
    for _ in range(50):  # a long stream before the recorded one
        tail.add(b'data: {"choices": []}\n\n' * 10)
    for i in range(0, len(stream), 7):  # chunk boundaries anywhere, even inside an event
        tail.add(stream[i : i + 7])
    kept = tail.bytes()
    assert kept.endswith(stream) and len(kept) < 2 * len(stream) + 300
    assert usage_from_tail(kept) == (14, 6)


def test_filter_headers_drops_hop_by_hop_and_connection_named_ones() -> None:
    headers = [
        (b"Connection", b"keep-alive, X-Trace"),
        (b"x-trace", b"1"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Type", b"application/json"),
        (b"Authorization", b"Bearer k"),
        (b"Host", b"a"),
    ]
    assert filter_headers(headers, HOP_BY_HOP) == [
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer k"),
        (b"host", b"a"),
    ]
    assert filter_headers(headers, DROP_TO_ENGINE) == [(b"content-type", b"application/json")]


def test_a_get_with_a_body_is_refused_and_never_forwarded() -> None:
    proxy = Proxy(Settings.from_env({**REQUIRED, "MODELSERVE_AUTH": "public"}), None, SidecarMetrics())
    refused = proxy._plan(Exchange(0.0), "GET", "/v1/models", [], b'{"model": "tiny"}')
    assert isinstance(refused, errors.ErrorResponse)
    assert (refused.status, refused.code, refused.type) == (400, "body_not_allowed", "invalid_request_error")
    planned = proxy._plan(Exchange(0.0), "GET", "/v1/models", [], b"")
    assert not isinstance(planned, errors.ErrorResponse)
    assert (planned.route, planned.route.method, planned.body) == (routes.MODELS, "GET", b"")


def test_listed_models_reads_vllms_answer() -> None:
    assert listed_models(json.loads(read_recording("models.http").body)) == ["tiny"]
    assert listed_models({"object": "list"}) == [] and listed_models([]) == []


def test_metrics_render_appends_the_engine_text_and_keeps_labels_bounded() -> None:
    assert route_label("/v1/chat/completions") == "/v1/chat/completions"
    assert route_label("/v1/chat/completions/../../etc") == "other"
    assert {route_label(path) for path in routes.ALLOWED_PATHS} == set(routes.ALLOWED_PATHS)
    metrics = SidecarMetrics()
    metrics.observe("/v1/models", "2xx", 0.01, 0.005)
    text = metrics.render(b"vllm:num_requests_running 0.0")
    assert b'modelserve_sidecar_requests_total{route="/v1/models",status_class="2xx"} 1.0' in text
    assert b"modelserve_sidecar_process_cpu_seconds_total" in text
    assert text.endswith(b"vllm:num_requests_running 0.0\n")
    assert b"\nprocess_" not in text  # the engine's unprefixed process series cannot collide


@pytest.mark.parametrize(
    ("body", "many"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * 10_000_000 + b'"}]}', False),
        (b'{"model": "m", "x": [' + b"[]," * 20_000 + b"[]]}", True),
        (b'{"model": "m", "prompt": [' + b"1," * 19_000 + b"1]}", False),
        (b"[" * 15_000, False),  # shorter than MANY_VALUES bytes: fewer values, whatever they are
    ],
)
def test_a_body_of_many_json_values_is_told_from_a_large_one(body: bytes, many: bool) -> None:
    """Read off the loop for its values alone: its owner's share (whole) would take any of these."""
    proxy = Proxy(Settings.from_env({**REQUIRED, "MODELSERVE_AUTH": "public"}), None, SidecarMetrics())
    assert proxy.loop_share is not None and proxy.loop_share.rate > json_body.value_count(body)
    assert proxy.reads_off_loop(body, proxy.owner([], "10.0.0.1", None)) is many
