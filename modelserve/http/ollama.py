"""Ollama's native API (`/api/*`) translated to and from the engine's OpenAI API (pure).

The adapter (`ollama_asgi`) turns each Ollama request into one engine request with `plan()`, sends
it through the proxy (so keys, limits, checks, sampling defaults, demand and metrics are the same as
on `/v1`), and translates the answer back with the functions below.

Routes:

    POST /api/chat      -> POST /v1/chat/completions
    POST /api/generate  -> POST /v1/chat/completions (a user turn, and a system turn for `system`)
    GET  /api/tags      -> GET  /v1/models  (the served model in Ollama's list shape)
    POST /api/show      -> GET  /v1/models  (the served model's details)
    GET  /api/version   -> GET  /v1/models  (answers once the key passes and the engine is up)
    GET  /api/ps        -> GET  /v1/models  (the served model, loaded, when the engine lists it)

A chat with no messages, or a generate with an empty prompt (Ollama: "load the model"), is also a
`GET /v1/models`: the model is always loaded here, so it answers `done_reason: "load"` (or
`"unload"` for `keep_alive: 0`, which unloads nothing) without generating.

Request fields:

    Ollama                  OpenAI body                   notes
    model                   model                         the served name, or `<served>:latest`;
                                                          anything else is 404 (Ollama's words)
    messages[].content      messages[].content
    messages[].images       image_url parts (data: URLs)  mime type sniffed from the bytes; the
                                                          sidecar's vision check applies
    messages[].tool_calls   tool_calls                    arguments object -> JSON string, ids made up
    messages[] role "tool"  tool_call_id                  matched to the preceding call (by name)
    messages[].thinking     -                             dropped (engines do not take it back)
    prompt / system         user / system message         /api/generate
    images                  image_url parts               /api/generate
    tools                   tools                         the same shape
    format "json"           response_format json_schema   {"type": "object"} (what every engine
                                                          constrains; Ollama's json grammar is an object)
    format {schema}         response_format json_schema   name "response"
    stream (default true)   stream, stream_options.include_usage
    options.temperature     temperature
    options.top_k           top_k
    options.top_p           top_p
    options.min_p           min_p
    options.repeat_penalty  repetition_penalty            vLLM's and SGLang's name (for llama.cpp,
                                                          which ignores it, the proxy copies it to
                                                          `repeat_penalty`: MODELSERVE_SAMPLING_ALIASES)
    options.presence_penalty, frequency_penalty, seed     the same names
    options.stop            stop                          a string becomes a one-item list
    options.num_predict     max_tokens                    -1 / -2 (unlimited) and absent: left out,
                                                          so the ModelServer's default applies
    other options           -                             ignored, as Ollama ignores unknown ones:
                                                          num_ctx, num_gpu, num_thread, mirostat*,
                                                          typical_p, repeat_last_n, ... are the
                                                          engine's own (load-time) settings here
    keep_alive, think       -                             ignored (the engine keeps the model loaded;
                                                          reasoning text comes back as `thinking`
                                                          whenever the engine separates it)
    raw: true, template,    -                             refused, 400 naming the field: the engine
    suffix, context                                       applies its own chat template

Answers: Ollama's shapes, NDJSON (`application/x-ndjson`) for streams. The last object carries
`done_reason` ("stop", "length"), token counts from the engine's `usage` (0 when it sent none) and
durations in nanoseconds: `total_duration` as the sidecar measured it, `prompt_eval_duration` and
`eval_duration` from the engine's `timings` (llama.cpp) or else the sidecar's clock (time to the
first token, and from it to the end), `load_duration` 0 (the model is loaded before the pod is
ready). `context` (generate's token ids) is not returned.

Errors use Ollama's shape, `{"error": "<message>"}`, with the status of the sidecar's or the engine's
OpenAI-shaped error (401, 400, 413, 503, ...): Ollama clients raise `ResponseError` from it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelserve.contracts import routes

from .json_body import BadJson, encode, parse

CHAT_ROUTE = routes.OLLAMA_CHAT.path
GENERATE_ROUTE = routes.OLLAMA_GENERATE.path
TAGS_ROUTE = routes.OLLAMA_TAGS.path
SHOW_ROUTE = routes.OLLAMA_SHOW.path
VERSION_ROUTE = routes.OLLAMA_VERSION.path
PS_ROUTE = routes.OLLAMA_PS.path
# The routes this module translates: the allowlist's entries under /api/ (each with its one method).
ROUTES = frozenset(path for _, path in routes.CONSUMER_ROUTES if path.startswith(routes.OLLAMA_PREFIX))
# What /api/ps says a loaded model stays loaded until: the engine never unloads it (Ollama's own
# answer for keep_alive -1, which clients show as "Forever").
LOADED_FOREVER = "2318-01-01T00:00:00Z"
ENGINE_CHAT = "/v1/chat/completions"
ENGINE_MODELS = "/v1/models"
NDJSON = "application/x-ndjson"
# The Ollama API version these shapes follow; the build metadata says who answers.
OLLAMA_API_VERSION = "0.6.0"
_COMPACT = (",", ":")  # Ollama writes JSON without spaces

# Options with the same meaning in the OpenAI body, and the type each must have.
_NUMBER_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_INTEGER_OPTIONS = {"top_k": "top_k", "seed": "seed", "num_predict": "max_tokens"}
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


@dataclass(frozen=True)
class Refusal:
    """An answer the sidecar gives itself, in Ollama's error shape."""

    status: int
    message: str

    def body(self) -> bytes:
        return error_body(self.message)


@dataclass(frozen=True)
class Plan:
    """The engine request for an Ollama request, and how to read its answer."""

    route: str  # the Ollama route
    method: str
    path: str  # the engine path
    body: bytes
    model: str  # as the client named it: Ollama echoes it back
    stream: bool = False
    done_reason: str = ""  # set for a load request, answered without generating


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=_COMPACT).encode()


def now_rfc3339() -> str:
    """Ollama's `created_at`: UTC with a Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def listed_name(served: str) -> str:
    """The served model as Ollama lists it, with a tag (Ollama names always have one)."""
    return served if ":" in served else served + ":latest"


def version_string(modelserve_version: str) -> str:
    return f"{OLLAMA_API_VERSION}+modelserve.{modelserve_version}"


# --- requests -------------------------------------------------------------------------------------


def plan(route: str, body: bytes, served: str, adapters: Collection[str] = ()) -> Plan | Refusal:
    """The engine request for an Ollama request body, or the refusal to answer with. `adapters`:
    the LoRA adapters served beside the base, asked for by their own names as the base is."""
    if route in (TAGS_ROUTE, VERSION_ROUTE, PS_ROUTE):
        return Plan(route, "GET", ENGINE_MODELS, b"", listed_name(served))
    request = parse(body) if body.strip() else {}
    if isinstance(request, BadJson):
        return invalid_json(request)
    if not isinstance(request, dict):
        return Refusal(400, "the request body must be a JSON object")
    if route == SHOW_ROUTE:
        name = request.get("model") or request.get("name")
        if not isinstance(name, str) or not name:
            return Refusal(400, "model is required")
        if _target(name, served, adapters) is None:
            return Refusal(404, f"model '{name}' not found")
        return Plan(route, "GET", ENGINE_MODELS, b"", name)

    model = request.get("model")
    if not isinstance(model, str) or not model:
        return Refusal(400, "model is required")
    target = _target(model, served, adapters)
    if target is None:
        return Refusal(404, f'model "{model}" not found, try pulling it first')
    stream = request.get("stream") is not False  # Ollama streams unless told not to
    openai = chat_request(request, target) if route == CHAT_ROUTE else generate_request(request, target)
    if isinstance(openai, Refusal):
        return openai
    if not openai["messages"]:  # Ollama: load the model and say so
        reason = "unload" if request.get("keep_alive") in (0, "0", "0s") else "load"
        return Plan(route, "GET", ENGINE_MODELS, b"", model, stream, reason)
    if stream:
        openai["stream"] = True
        openai["stream_options"] = {"include_usage": True}
    encoded = encode(openai)  # the request's schemas and tools a few levels deeper: maybe too deep
    if isinstance(encoded, BadJson):
        return invalid_json(encoded)
    return Plan(route, "POST", ENGINE_CHAT, encoded, model, stream)


def invalid_json(bad: BadJson) -> Refusal:
    return Refusal(400, f"invalid JSON in the request body: {bad.reason}")


def _target(requested: str, served: str, adapters: Collection[str]) -> str | None:
    """The OpenAI `model` an Ollama name means: the served base or one of its adapters, or None."""
    return next((name for name in (served, *adapters) if serves(requested, name)), None)


def serves(requested: str, served: str) -> bool:
    """Whether an Ollama model name means the served model (`:latest` is Ollama's default tag)."""
    return requested in (served, served + ":latest")


def chat_request(request: Mapping[str, Any], served: str) -> dict[str, Any] | Refusal:
    messages = request.get("messages") or []
    if not isinstance(messages, list):
        return Refusal(400, "messages must be a list")
    translated = chat_messages(messages)
    if isinstance(translated, Refusal):
        return translated
    openai: dict[str, Any] = {"model": served, "messages": translated}
    tools = request.get("tools")
    if tools:
        openai["tools"] = tools  # Ollama's tools are OpenAI's
    return _common(request, openai)


def generate_request(request: Mapping[str, Any], served: str) -> dict[str, Any] | Refusal:
    if request.get("raw") is True:
        return Refusal(400, "raw is not supported: the engine applies the model's own chat template")
    for field in ("template", "suffix", "context"):
        if request.get(field):
            return Refusal(400, f"{field} is not supported by this server (modelserve translates to the OpenAI API)")
    prompt = request.get("prompt") or ""
    system = request.get("system") or ""
    if not isinstance(prompt, str) or not isinstance(system, str):
        return Refusal(400, "prompt and system must be strings")
    images = request.get("images") or []
    messages: list[dict[str, Any]] = []
    if prompt or images:
        if system:
            messages.append({"role": "system", "content": system})
        user = _content(prompt, images)
        if isinstance(user, Refusal):
            return user
        messages.append({"role": "user", "content": user})
    return _common(request, {"model": served, "messages": messages})


def chat_messages(messages: list[Any]) -> list[dict[str, Any]] | Refusal:
    """Ollama's messages as OpenAI's: images as parts, tool calls with string arguments and ids."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not yet answered by a tool message
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return Refusal(400, f"messages[{i}] must be an object with a role")
        role = message["role"]
        content = _content(message.get("content") or "", message.get("images") or [])
        if isinstance(content, Refusal):
            return content
        item: dict[str, Any] = {"role": role, "content": content}
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                return Refusal(400, f"messages[{i}].tool_calls must be a list")
            pending_calls = []
            for k, call in enumerate(calls):
                openai_call = _openai_call(call, f"call_{i}_{k}", f"messages[{i}].tool_calls[{k}]")
                if isinstance(openai_call, Refusal):
                    return openai_call
                pending_calls.append(openai_call)
            item["tool_calls"] = pending_calls
            pending = [(call["id"], call["function"]["name"]) for call in pending_calls]
        if role == "tool":
            call_id = message.get("tool_call_id") or _answered(pending, message.get("tool_name"))
            if call_id:
                item["tool_call_id"] = call_id
        out.append(item)
    return out


def _answered(pending: list[tuple[str, str]], name: Any) -> str | None:
    """The id of the call a tool message answers: the first pending one of its name, else the first."""
    for k, (call_id, call_name) in enumerate(pending):
        if name is None or call_name == name:
            del pending[k]
            return call_id
    return pending.pop(0)[0] if pending else None


def _openai_call(call: Any, default_id: str, where: str) -> dict[str, Any] | Refusal:
    """An Ollama tool call as OpenAI's (arguments as a JSON string); its name a string, as Ollama's
    own types have it (it is compared with the tool messages' `tool_name`)."""
    function = call.get("function", {}) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name", ""), str):
        return Refusal(400, f"{where} must be an object with a function name")
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        encoded = encode(arguments)
        if isinstance(encoded, BadJson):
            return Refusal(400, f"invalid JSON in {where}.function.arguments: {encoded.reason}")
        arguments = encoded.decode()
    return {
        "id": call.get("id") or default_id,
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": arguments},
    }


def _content(text: Any, images: Any) -> str | list[dict[str, Any]] | Refusal:
    """A message's content: the text, or text and image parts when there are images."""
    if not isinstance(text, str):
        return Refusal(400, "content must be a string")
    if not images:
        return text
    if not isinstance(images, list):
        return Refusal(400, "images must be a list of base64 strings")
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        part = image_part(image)
        if isinstance(part, Refusal):
            return part
        parts.append(part)
    return parts


def image_part(image: Any) -> dict[str, Any] | Refusal:
    """An Ollama image (base64, no data: prefix) as an OpenAI image_url part with a data: URL."""
    if not isinstance(image, str):
        return Refusal(400, "images must be base64 strings")
    if image.startswith("data:"):  # already a data URL
        return {"type": "image_url", "image_url": {"url": image}}
    try:
        head = base64.b64decode(image[:64] + "=" * (-len(image[:64]) % 4), validate=True)
    except (binascii.Error, ValueError):
        return Refusal(400, "an image is not valid base64")
    return {"type": "image_url", "image_url": {"url": f"data:{image_type(head)};base64,{image}"}}


def image_type(head: bytes) -> str:
    """The mime type from an image's first bytes (JPEG when unknown: the engines sniff it anyway)."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return "image/jpeg"


def _common(request: Mapping[str, Any], openai: dict[str, Any]) -> dict[str, Any] | Refusal:
    """Options and format, shared by chat and generate."""
    options = translate_options(request.get("options") or {})
    if isinstance(options, Refusal):
        return options
    openai.update(options)
    fmt = request.get("format")
    if fmt == "json":
        openai["response_format"] = _schema_format("json", {"type": "object"})
    elif isinstance(fmt, dict):
        openai["response_format"] = _schema_format("response", fmt)
    elif fmt not in (None, ""):
        return Refusal(400, 'format must be "json" or a JSON schema object')
    return openai


def _schema_format(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def translate_options(options: Any) -> dict[str, Any] | Refusal:
    """Ollama `options` as OpenAI body fields; options without an OpenAI field are ignored."""
    if not isinstance(options, dict):
        return Refusal(400, "options must be an object")
    out: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in _NUMBER_OPTIONS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return Refusal(400, f"option {name!r} must be a number")
            out[_NUMBER_OPTIONS[name]] = value
        elif name in _INTEGER_OPTIONS:
            if not _is_integer(value):
                return Refusal(400, f"option {name!r} must be an integer")
            if name == "num_predict" and value < 0:
                continue  # -1 infinite, -2 fill the context: no limit asked for
            out[_INTEGER_OPTIONS[name]] = int(value)
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                return Refusal(400, "option 'stop' must be a string or a list of strings")
            if stops:
                out["stop"] = stops
    return out


# --- answers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clock:
    """When the exchange started, its first answer byte and its end (perf_counter seconds)."""

    start: float
    first: float | None
    end: float


def final_fields(done_reason: str, usage: Any, timings: Any, clock: Clock) -> dict[str, Any]:
    """The fields of the last object: why it stopped, token counts and durations (nanoseconds)."""
    usage = usage if isinstance(usage, dict) else {}
    timings = timings if isinstance(timings, dict) else {}
    first = clock.first if clock.first is not None else clock.end
    prompt_ms, predicted_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
    return {
        "done": True,
        "done_reason": done_reason,
        "total_duration": _ns(clock.end - clock.start),
        "load_duration": 0,
        "prompt_eval_count": _count(usage.get("prompt_tokens")),
        "prompt_eval_duration": _ns(prompt_ms / 1000 if _is_number(prompt_ms) else first - clock.start),
        "eval_count": _count(usage.get("completion_tokens")),
        "eval_duration": _ns(predicted_ms / 1000 if _is_number(predicted_ms) else clock.end - first),
    }


def done_reason(finish_reason: Any) -> str:
    """OpenAI's finish_reason as Ollama's done_reason (a tool call ends with "stop" in Ollama)."""
    return "length" if finish_reason == "length" else "stop"


def chat_answer(route: str, answer: Mapping[str, Any], model: str, created_at: str, clock: Clock) -> dict[str, Any]:
    """A whole (non-streamed) chat completion as Ollama's one answer object."""
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    text = message.get("content") or ""
    out: dict[str, Any] = {"model": model, "created_at": created_at}
    if route == CHAT_ROUTE:
        out["message"] = _message(text, message.get("reasoning_content"), message.get("tool_calls"))
    else:
        out["response"] = text
        if message.get("reasoning_content"):
            out["thinking"] = message["reasoning_content"]
    reason = done_reason(choice.get("finish_reason"))
    return out | final_fields(reason, answer.get("usage"), answer.get("timings"), clock)


def load_answer(route: str, model: str, created_at: str, reason: str) -> dict[str, Any]:
    """What Ollama answers a request that only loads (or unloads) the model."""
    out: dict[str, Any] = {"model": model, "created_at": created_at}
    if route == CHAT_ROUTE:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return out | {"done": True, "done_reason": reason}


def _message(text: str, thinking: Any, tool_calls: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = [ollama_call(call) for call in tool_calls if isinstance(call, dict)]
    return message


def ollama_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call as Ollama's: the arguments as an object (`{}` if they are not one)."""
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    raw = function.get("arguments") or "{}"
    arguments = parse(raw) if isinstance(raw, str) else raw  # the model's text: maybe not JSON at all
    return {
        "function": {"name": function.get("name", ""), "arguments": arguments if isinstance(arguments, dict) else {}}
    }


def error_message(body: bytes, status: int) -> str:
    """The message of an OpenAI-shaped error answer (the sidecar's, vLLM's, SGLang's, llama.cpp's)."""
    data = parse(body)
    if isinstance(data, BadJson):
        text = body.decode("utf-8", "replace").strip()
        return text or f"the engine answered HTTP {status}"
    return error_text(data, status)


def error_text(data: Any, status: int) -> str:
    """The message of a decoded OpenAI-shaped error."""
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for value in (error, data.get("message"), data.get("detail")):
            if isinstance(value, str) and value:
                return value
    return f"the engine answered HTTP {status}"


# --- the served model: /api/tags, /api/show -----------------------------------------------------------


def _engine_entry(models: Any, served: str) -> dict[str, Any]:
    """The served model's entry in the engine's /v1/models answer ({} if it is not there)."""
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and entry.get("id") == served:
            return entry
    return {}


def model_details(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama's `details`; only llama.cpp's `meta` says anything (parameter count), else empty."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    params = meta.get("n_params")
    return {
        "parent_model": "",
        "format": "gguf" if entry.get("owned_by") == "llamacpp" else "",
        "family": "",
        "families": [],
        "parameter_size": parameter_size(params) if isinstance(params, int) else "",
        "quantization_level": "",
    }


def parameter_size(count: int) -> str:
    """A parameter count the way Ollama prints one (7.2B, 268.10M)."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    return str(count)


def _modified_at(entry: Mapping[str, Any]) -> str:
    created = entry.get("created")
    seconds = created if isinstance(created, int) and not isinstance(created, bool) else 0
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tags_answer(models: Any, served: str) -> dict[str, Any]:
    """The served model in Ollama's model list, then the LoRA adapters the engine lists with it as
    their parent (vLLM and SGLang list loaded adapters so), each naming its base in `details`."""
    entry = _engine_entry(models, served)
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    size = meta.get("size")
    name = listed_name(served)
    base = {
        "name": name,
        "model": name,
        "modified_at": _modified_at(entry),
        "size": size if isinstance(size, int) else 0,
        "digest": "",
        "details": model_details(entry),
    }
    adapters = [
        {**base, "name": listed_name(child["id"]), "model": listed_name(child["id"]), "details": {"parent_model": name}}
        for child in _adapter_entries(models, served)
    ]
    return {"models": [base, *adapters]}


def _adapter_entries(models: Any, served: str) -> list[dict[str, Any]]:
    data = models.get("data") if isinstance(models, dict) else None
    return [
        entry
        for entry in (data if isinstance(data, list) else [])
        if isinstance(entry, dict) and entry.get("parent") == served and isinstance(entry.get("id"), str)
    ]


def ps_answer(models: Any, served: str) -> dict[str, Any]:
    """The served model in Ollama's list of loaded models when the engine lists it (it is loaded
    then), else an empty list."""
    if not _engine_entry(models, served):
        return {"models": []}
    return {"models": [loaded(entry) for entry in tags_answer(models, served)["models"]]}


def loaded(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An /api/tags entry as an /api/ps one: loaded for good, its size (if known) all in memory."""
    return {**entry, "expires_at": LOADED_FOREVER, "size_vram": entry["size"]}


def show_answer(models: Any, served: str, vision: bool) -> dict[str, Any]:
    entry = _engine_entry(models, served)
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    info: dict[str, Any] = {}
    if isinstance(meta.get("n_params"), int):
        info["general.parameter_count"] = meta["n_params"]
    context = meta.get("n_ctx_train", entry.get("max_model_len"))
    if isinstance(context, int):
        info["context_length"] = context
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": model_details(entry),
        "model_info": info,
        "capabilities": ["completion", "vision"] if vision else ["completion"],
        "modified_at": _modified_at(entry),
    }


# --- streams: OpenAI server-sent events -> Ollama NDJSON ------------------------------------------


class StreamTranslator:
    """Reads an engine's SSE stream chunk by chunk and gives Ollama's NDJSON objects. Tool calls
    arrive in fragments and are sent whole, in one object before the last."""

    def __init__(self, route: str, model: str) -> None:
        self.route = route
        self.model = model
        self._buffer = b""
        self._finish: Any = None
        self._usage: Any = None
        self._timings: Any = None
        self._calls: dict[int, dict[str, Any]] = {}
        self.failed = False  # the engine sent an error event: no `done` object follows
        self.finished = False

    def feed(self, chunk: bytes, created_at: str) -> list[dict[str, Any]]:
        self._buffer += chunk
        out: list[dict[str, Any]] = []
        # Events end with a blank line; engines write \n\n (the SSE spec allows \r\n too).
        self._buffer = self._buffer.replace(b"\r\n", b"\n")
        while (end := self._buffer.find(b"\n\n")) >= 0:
            event, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            out.extend(self._event(event, created_at))
        return out

    def finish(self, created_at: str, clock: Clock) -> list[dict[str, Any]]:
        """The last objects, when the engine's stream has ended."""
        if self.failed or self.finished:
            return []
        self.finished = True
        out = []
        if self._calls:
            calls = [self._calls[k] for k in sorted(self._calls)]
            out.append(self._chunk("", None, created_at) | {"message": _message("", None, calls)})
        last = self._chunk("", None, created_at)
        return [*out, last | final_fields(done_reason(self._finish), self._usage, self._timings, clock)]

    def _event(self, event: bytes, created_at: str) -> list[dict[str, Any]]:
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            return []
        payload = parse(data)
        return [] if isinstance(payload, BadJson) else self.event(payload, created_at)

    def event(self, event: Any, created_at: str) -> list[dict[str, Any]]:
        """One decoded OpenAI stream event as Ollama objects (none for events without text)."""
        if not isinstance(event, dict):
            return []
        if "error" in event:  # vLLM reports a failure mid-stream as an event
            self.failed = True
            return [{"error": error_text(event, 500)}]
        if event.get("usage"):
            self._usage = event["usage"]
        if event.get("timings"):  # llama.cpp's own measurements
            self._timings = event["timings"]
        out = []
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._add_call(call)
            text, thinking = delta.get("content") or "", delta.get("reasoning_content")
            if text or thinking:
                out.append(self._chunk(text, thinking, created_at))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def _chunk(self, text: str, thinking: Any, created_at: str) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": created_at}
        if self.route == CHAT_ROUTE:
            out["message"] = _message(text, thinking, None)
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        return out | {"done": False}

    def _add_call(self, delta: Mapping[str, Any]) -> None:
        index = delta.get("index", len(self._calls))
        call = self._calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    """An integer, or a float with no fraction (JSON's 8.0); never float() of a long integer, which
    overflows past 309 digits."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)
