"""Unit tests of the Ollama translation (pure; no processes, no network). The engine answers are
recorded ones: vLLM's from tests/fixtures/vllm-0.32.0-cpu, llama.cpp's (b9093) and a tool-call
stream written below as data."""

from __future__ import annotations

import base64
import json
import sys

import pytest

from harness.sidecar import hostile_json, nested_object, read_recording
from modelserve.http import ollama
from modelserve.http.ollama import Clock, Plan, Refusal, StreamTranslator
from modelserve.sidecar.metrics import route_label

SERVED = "gemma-3-270m"
NOW = "2026-11-23T03:28:09.211038Z"
CLOCK = Clock(start=10.0, first=10.25, end=11.0)

# llama.cpp b9093's answer to {"max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}
LLAMA_CPP_STREAM = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"<"}}],"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"|"}}],"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"im"}}],'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":25,'
    b'"total_tokens":28},"timings":{"prompt_n":25,"prompt_ms":144.551,"predicted_n":3,"predicted_ms":25.761}}\n\n'
    b"data: [DONE]\n\n"
)
# A tool call streamed in fragments, the way vLLM and llama.cpp send one.
TOOL_CALL_STREAM = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                },
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 12}},
]
# What Ollama's clients send for one image (the Python client base64-encodes the file's bytes).
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 16).decode()
GIF = base64.b64encode(b"GIF89a" + b"\x00" * 16).decode()
WEBP = base64.b64encode(b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 8).decode()


def planned(route: str, request: dict) -> Plan:
    result = ollama.plan(route, json.dumps(request).encode(), SERVED)
    assert isinstance(result, Plan), result
    return result


def engine_body(route: str, request: dict) -> dict:
    return json.loads(planned(route, request).body)


# --- requests ---------------------------------------------------------------------------------------


def test_chat_streams_by_default_and_asks_for_usage() -> None:
    plan = planned(ollama.CHAT_ROUTE, {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]})
    assert (plan.method, plan.path, plan.stream, plan.model) == ("POST", "/v1/chat/completions", True, SERVED)
    assert json.loads(plan.body) == {
        "model": SERVED,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_stream_false_is_one_answer() -> None:
    plan = planned(
        ollama.CHAT_ROUTE,
        {"model": SERVED + ":latest", "messages": [{"role": "user", "content": "hi"}], "stream": False},
    )
    assert not plan.stream and "stream" not in json.loads(plan.body)
    assert plan.model == SERVED + ":latest"  # echoed as the client named it
    assert json.loads(plan.body)["model"] == SERVED  # the engine's own name


def test_options_translate_and_unknown_ones_are_ignored() -> None:
    options = {
        "temperature": 0,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "seed": 7,
        "stop": "\n\n",
        "num_predict": 16,
        "num_ctx": 8192,
        "mirostat": 2,
        "num_gpu": 1,
        "typical_p": 0.7,
    }
    body = engine_body(ollama.GENERATE_ROUTE, {"model": SERVED, "prompt": "x", "stream": False, "options": options})
    assert {k: v for k, v in body.items() if k not in ("model", "messages")} == {
        "temperature": 0,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "seed": 7,
        "stop": ["\n\n"],
        "max_tokens": 16,
    }


def test_integer_options_of_any_size_never_overflow() -> None:
    huge = int("9" * 400)  # float() of it overflows
    assert ollama.translate_options({"seed": huge, "num_predict": 8.0}) == {"seed": huge, "max_tokens": 8}
    assert ollama.translate_options({"top_k": 1e308 * 10}) == Refusal(400, "option 'top_k' must be an integer")


@pytest.mark.parametrize("unlimited", [-1, -2])
def test_unlimited_num_predict_leaves_max_tokens_out(unlimited: int) -> None:
    assert ollama.translate_options({"num_predict": unlimited, "stop": ["a", "b"]}) == {"stop": ["a", "b"]}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": "hot"}, "option 'temperature' must be a number"),
        ({"top_k": 1.5}, "option 'top_k' must be an integer"),
        ({"num_predict": True}, "option 'num_predict' must be an integer"),
        ({"stop": [1]}, "option 'stop' must be a string or a list of strings"),
        ([], "options must be an object"),
    ],
)
def test_wrong_option_types_are_refused(options: object, message: str) -> None:
    assert ollama.translate_options(options) == Refusal(400, message)


def test_format_json_and_schema_become_response_format() -> None:
    request = {"model": SERVED, "prompt": "x", "format": "json"}
    assert engine_body(ollama.GENERATE_ROUTE, request)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "json", "schema": {"type": "object"}},
    }
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert engine_body(
        ollama.CHAT_ROUTE, {**request, "messages": [{"role": "user", "content": "x"}], "format": schema}
    )["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    assert ollama.plan(ollama.GENERATE_ROUTE, json.dumps({**request, "format": "yaml"}).encode(), SERVED) == Refusal(
        400, 'format must be "json" or a JSON schema object'
    )


def test_generate_has_a_system_turn_and_ignores_keep_alive_and_think() -> None:
    body = engine_body(
        ollama.GENERATE_ROUTE,
        {"model": SERVED, "prompt": "Why?", "system": "Be brief.", "keep_alive": "5m", "think": True, "raw": False},
    )
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    assert "keep_alive" not in body and "think" not in body


@pytest.mark.parametrize(
    ("field", "value"),
    [("raw", True), ("template", "{{ .Prompt }}"), ("suffix", "return x"), ("context", [1, 2, 3])],
)
def test_generate_refuses_what_does_not_translate_naming_the_field(field: str, value: object) -> None:
    refusal = ollama.plan(
        ollama.GENERATE_ROUTE, json.dumps({"model": SERVED, "prompt": "x", field: value}).encode(), SERVED
    )
    assert (
        isinstance(refusal, Refusal)
        and refusal.status == 400
        and refusal.message.startswith(f"{field} is not supported")
    )


@pytest.mark.parametrize(
    ("route", "request_body", "reason"),
    [
        (ollama.GENERATE_ROUTE, {"model": SERVED}, "load"),
        (ollama.GENERATE_ROUTE, {"model": SERVED, "prompt": "", "keep_alive": 0}, "unload"),
        (ollama.CHAT_ROUTE, {"model": SERVED, "messages": []}, "load"),
    ],
)
def test_a_load_request_asks_the_engine_only_for_its_model_list(route: str, request_body: dict, reason: str) -> None:
    plan = planned(route, request_body)
    assert (plan.method, plan.path, plan.body, plan.done_reason) == ("GET", "/v1/models", b"", reason)
    answer = ollama.load_answer(route, SERVED, NOW, reason)
    assert answer["done"] is True and answer["done_reason"] == reason
    assert answer.get("response", answer.get("message", {}).get("content")) == ""


@pytest.mark.parametrize(
    ("route", "body", "refusal"),
    [
        (
            ollama.CHAT_ROUTE,
            {"model": "llama3", "messages": []},
            Refusal(404, 'model "llama3" not found, try pulling it first'),
        ),
        (
            ollama.CHAT_ROUTE,
            {"model": SERVED + ":7b", "messages": []},
            Refusal(404, f'model "{SERVED}:7b" not found, try pulling it first'),
        ),
        (ollama.GENERATE_ROUTE, {"prompt": "x"}, Refusal(400, "model is required")),
        (ollama.SHOW_ROUTE, {"model": "x"}, Refusal(404, "model 'x' not found")),
        (ollama.SHOW_ROUTE, {}, Refusal(400, "model is required")),
        (ollama.CHAT_ROUTE, [1], Refusal(400, "the request body must be a JSON object")),
        (ollama.CHAT_ROUTE, {"model": SERVED, "messages": "hi"}, Refusal(400, "messages must be a list")),
    ],
)
def test_refusals_in_ollamas_words(route: str, body: object, refusal: Refusal) -> None:
    assert ollama.plan(route, json.dumps(body).encode(), SERVED) == refusal
    assert json.loads(refusal.body()) == {"error": refusal.message}


def test_invalid_json_is_refused() -> None:
    refusal = ollama.plan(ollama.CHAT_ROUTE, b'{"model": ', SERVED)
    assert isinstance(refusal, Refusal) and refusal.status == 400 and "invalid JSON" in refusal.message


@pytest.mark.parametrize("name", sorted(hostile_json()))
def test_hostile_json_is_refused_in_ollamas_words(name: str) -> None:
    for route in (ollama.CHAT_ROUTE, ollama.GENERATE_ROUTE, ollama.SHOW_ROUTE):
        refusal = ollama.plan(route, hostile_json()[name], SERVED)
        assert isinstance(refusal, Refusal) and refusal.status == 400, (route, name)
        assert refusal.message.startswith("invalid JSON in the request body: ")


def test_a_format_nested_to_the_limit_is_planned_or_refused_never_raised() -> None:
    # Every depth around the recursion limit, wherever the stack stands: read, put two objects
    # deeper into response_format and written, or refused; never raised.
    limit = sys.getrecursionlimit()
    for depth in range(limit - 150, limit + 10):
        body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "format": %s}' % (
            SERVED.encode(),
            nested_object(depth),
        )
        answer = ollama.plan(ollama.CHAT_ROUTE, body, SERVED)
        assert isinstance(answer, Plan) or (answer.status, answer.message[:12]) == (400, "invalid JSON"), depth


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (1, "messages[0].tool_calls[0] must be an object with a function name"),
        ({"function": "f"}, "messages[0].tool_calls[0] must be an object with a function name"),
        ({"function": {"name": ["f"]}}, "messages[0].tool_calls[0] must be an object with a function name"),
    ],
)
def test_a_tool_call_that_is_no_call_is_refused(call: object, message: str) -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "tool_name": ["f"]}]
    body = json.dumps({"model": SERVED, "messages": messages}).encode()
    assert ollama.plan(ollama.CHAT_ROUTE, body, SERVED) == Refusal(400, message)


def test_show_takes_model_or_the_older_name_field() -> None:
    assert planned(ollama.SHOW_ROUTE, {"name": SERVED}).path == "/v1/models"
    assert planned(ollama.SHOW_ROUTE, {"model": SERVED + ":latest"}).model == SERVED + ":latest"
    assert planned(ollama.TAGS_ROUTE, {}).method == "GET"


@pytest.mark.parametrize(
    ("image", "mime"), [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (WEBP, "image/webp")]
)
def test_images_become_data_urls_with_the_sniffed_type(image: str, mime: str) -> None:
    body = engine_body(
        ollama.CHAT_ROUTE,
        {"model": SERVED, "messages": [{"role": "user", "content": "what is this", "images": [image]}]},
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{image}"}},
            ],
        }
    ]


def test_generate_images_go_into_the_user_turn() -> None:
    body = engine_body(ollama.GENERATE_ROUTE, {"model": SERVED, "prompt": "", "images": [PNG, JPEG]})
    assert [p["image_url"]["url"][:22] for p in body["messages"][0]["content"]] == [
        "data:image/png;base64,",
        "data:image/jpeg;base64",
    ]


def test_an_image_that_is_not_base64_is_refused() -> None:
    assert ollama.image_part("not base64!") == Refusal(400, "an image is not valid base64")


def test_tool_history_gets_ids_and_string_arguments() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "I should call the tool.",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "get_time", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
        {"role": "tool", "content": "sunny"},
    ]
    body = engine_body(ollama.CHAT_ROUTE, {"model": SERVED, "messages": messages, "tools": tools, "stream": False})
    assert body["tools"] == tools
    assert body["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_1_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    assert body["messages"][2]["tool_call_id"] == "call_1_1"  # by its name
    assert body["messages"][3]["tool_call_id"] == "call_1_0"  # the one left


# --- answers ----------------------------------------------------------------------------------------


def test_a_whole_vllm_chat_answer() -> None:
    recording = read_recording("chat.http")
    answer = json.loads(recording.body)
    result = ollama.chat_answer(ollama.CHAT_ROUTE, answer, "tiny", NOW, CLOCK)
    usage = answer["usage"]
    assert result == {
        "model": "tiny",
        "created_at": NOW,
        "message": {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
        "done": True,
        "done_reason": ollama.done_reason(answer["choices"][0]["finish_reason"]),
        "total_duration": 1_000_000_000,
        "load_duration": 0,
        "prompt_eval_count": usage["prompt_tokens"],
        "prompt_eval_duration": 250_000_000,  # no engine timings: the sidecar's clock
        "eval_count": usage["completion_tokens"],
        "eval_duration": 750_000_000,
    }


def test_a_whole_answer_with_tool_calls_and_reasoning() -> None:
    answer = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Paris, then.",
                    "tool_calls": [
                        {
                            "id": "x",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        },
                        {"id": "y", "type": "function", "function": {"name": "broken", "arguments": "{not json"}},
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9},
        "timings": {"prompt_ms": 12.5, "predicted_ms": 100},
    }
    result = ollama.chat_answer(ollama.CHAT_ROUTE, answer, SERVED, NOW, CLOCK)
    assert result["message"] == {
        "role": "assistant",
        "content": "",
        "thinking": "Paris, then.",
        "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "broken", "arguments": {}}},
        ],
    }
    assert result["done_reason"] == "stop"
    assert (result["prompt_eval_duration"], result["eval_duration"]) == (12_500_000, 100_000_000)  # llama.cpp's timings


def test_generate_answer_has_response_not_message() -> None:
    answer = {"choices": [{"finish_reason": "length", "message": {"content": "Paris"}}], "usage": None}
    result = ollama.chat_answer(ollama.GENERATE_ROUTE, answer, SERVED, NOW, CLOCK)
    assert result["response"] == "Paris" and "message" not in result
    assert (result["done_reason"], result["prompt_eval_count"], result["eval_count"]) == ("length", 0, 0)


def test_the_llama_cpp_stream_split_anywhere_gives_the_same_ndjson() -> None:
    def translate(pieces: list[bytes]) -> list[dict]:
        stream = StreamTranslator(ollama.CHAT_ROUTE, SERVED)
        out = [o for piece in pieces for o in stream.feed(piece, NOW)]
        return out + stream.finish(NOW, CLOCK)

    whole = translate([LLAMA_CPP_STREAM])
    assert whole == translate([LLAMA_CPP_STREAM[i : i + 7] for i in range(0, len(LLAMA_CPP_STREAM), 7)])
    assert [o["message"]["content"] for o in whole] == ["<", "|", "im", ""]
    assert [o["done"] for o in whole] == [False, False, False, True]
    assert whole[0] == {
        "model": SERVED,
        "created_at": NOW,
        "message": {"role": "assistant", "content": "<"},
        "done": False,
    }
    assert whole[-1] | {"created_at": NOW} == {
        "model": SERVED,
        "created_at": NOW,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "length",
        "total_duration": 1_000_000_000,
        "load_duration": 0,
        "prompt_eval_count": 25,
        "prompt_eval_duration": 144_551_000,
        "eval_count": 3,
        "eval_duration": 25_761_000,
    }


def test_the_recorded_vllm_stream_as_generate_chunks() -> None:
    recording = read_recording("chat_stream_usage.http")
    stream = StreamTranslator(ollama.GENERATE_ROUTE, "tiny")
    out = stream.feed(recording.body.replace(b"\n\n", b"\r\n\r\n"), NOW) + stream.finish(NOW, CLOCK)
    events = [json.loads(line[6:]) for line in recording.body.decode().splitlines() if line.startswith("data: {")]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert "".join(o["response"] for o in out) == text
    assert all(set(o) == {"model", "created_at", "response", "done"} for o in out[:-1])
    assert (out[-1]["done_reason"], out[-1]["prompt_eval_count"], out[-1]["eval_count"]) == ("length", 14, 6)


def test_a_streamed_tool_call_arrives_whole_before_the_last_object() -> None:
    stream = StreamTranslator(ollama.CHAT_ROUTE, SERVED)
    out = [o for e in TOOL_CALL_STREAM for o in stream.event(e, NOW)] + stream.finish(NOW, CLOCK)
    assert [o["done"] for o in out] == [False, True]
    assert out[0]["message"]["tool_calls"] == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert (out[1]["done_reason"], out[1]["eval_count"]) == ("stop", 12)
    assert stream.finish(NOW, CLOCK) == []  # once


def test_an_error_event_mid_stream_becomes_an_ollama_error_and_no_done() -> None:
    stream = StreamTranslator(ollama.CHAT_ROUTE, SERVED)
    event = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
    assert stream.feed(event, NOW) == [{"error": "engine died"}]
    assert stream.finish(NOW, CLOCK) == []


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (read_recording("err_unknown_model.http").body, 404, "The model `nope` does not exist. Valid aliases: tiny."),
        (read_recording("err_empty_messages.http").body, 400, None),
        (b'{"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}}', 400, "bad"),  # llama.cpp
        (b'{"object": "error", "message": "old vLLM", "code": 400}', 400, "old vLLM"),
        (b'{"detail": "Not Found"}', 404, "Not Found"),
        (b"upstream connect error", 502, "upstream connect error"),
        (b"", 503, "the engine answered HTTP 503"),
    ],
)
def test_error_messages_from_every_shape(body: bytes, status: int, message: str | None) -> None:
    expected = message or json.loads(body)["error"]["message"]
    assert ollama.error_message(body, status) == expected


def test_an_engines_json_that_python_cannot_read_is_not_json() -> None:
    # The model writes tool-call arguments and may be asked to write anything: an integer of 5,000
    # digits, 100,000 brackets.
    for arguments in ('{"n": ' + "1" * 5000 + "}", "[" * 100_000):
        call = {"function": {"name": "f", "arguments": arguments}}
        assert ollama.ollama_call(call) == {"function": {"name": "f", "arguments": {}}}
    long_integer = b"1" * 5000
    assert ollama.error_message(long_integer, 500) == long_integer.decode()
    stream = StreamTranslator(ollama.CHAT_ROUTE, SERVED)
    assert stream.feed(b'data: {"choices": [], "n": ' + long_integer + b"}\n\n", NOW) == []


def test_tags_and_show_from_vllms_and_llama_cpps_model_lists() -> None:
    vllm = json.loads(read_recording("models.http").body)
    tags = ollama.tags_answer(vllm, "tiny")
    assert tags["models"][0] | {"modified_at": None} == {
        "name": "tiny:latest",
        "model": "tiny:latest",
        "modified_at": None,
        "size": 0,
        "digest": "",
        "details": {
            "parent_model": "",
            "format": "",
            "family": "",
            "families": [],
            "parameter_size": "",
            "quantization_level": "",
        },
    }
    llama_cpp = {
        "object": "list",
        "data": [
            {
                "id": SERVED,
                "object": "model",
                "created": 1795404267,
                "owned_by": "llamacpp",
                "meta": {"n_ctx_train": 32768, "n_params": 268098176, "size": 246587904},
            }
        ],
    }
    listed = ollama.tags_answer(llama_cpp, SERVED)["models"][0]
    assert (listed["size"], listed["details"]["parameter_size"], listed["details"]["format"]) == (
        246587904,
        "268.10M",
        "gguf",
    )
    assert listed["modified_at"].endswith("Z")
    show = ollama.show_answer(llama_cpp, SERVED, vision=True)
    assert show["capabilities"] == ["completion", "vision"]
    assert show["model_info"] == {"general.parameter_count": 268098176, "context_length": 32768}
    assert ollama.show_answer(vllm, "tiny", vision=False)["capabilities"] == ["completion"]


def test_names_and_versions() -> None:
    assert ollama.listed_name("tiny") == "tiny:latest" and ollama.listed_name("llama3:8b") == "llama3:8b"
    assert ollama.serves("llama3:8b", "llama3:8b") and not ollama.serves("llama3", "llama3:8b")
    assert ollama.version_string("0.1.0") == "0.6.0+modelserve.0.1.0"
    assert ollama.parameter_size(7_241_732_096) == "7.2B"
    assert ollama.now_rfc3339().endswith("Z")


def test_api_routes_have_their_own_metrics_labels() -> None:
    for route in ollama.ROUTES:
        assert route_label(route) == route
    assert route_label("/api/pull") == "other"
