"""`modelserve run` end to end: the CLI as a process -> the real sidecar -> a real llama.cpp server
running the real Gemma-3-270M on this CPU (with --url and --key: no cluster here). And the Jinja a
Modelfile's TEMPLATE becomes, rendered by that llama.cpp server's own template engine."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness.sidecar import (
    API_KEY,
    ENGINE_MODEL,
    Engine,
    Sidecar,
    free_ports,
    launch_engine,
    metric_value,
    private_sidecar,
    stop_process,
    wait_until,
)
from modelserve.cli import modelfile

MAX_TOKENS = 24  # the sidecar's default: answers stay short on two cores
CLI_SECONDS = 120
PROMPT_TOKENS = "modelserve_sidecar_prompt_tokens_total"
OK_REQUESTS = 'modelserve_sidecar_requests_total{route="/v1/chat/completions",status_class="2xx"}'


@pytest.fixture(scope="module")
def sidecar(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with private_sidecar(engine.url, tmp_path_factory.mktemp("cli-sidecar"), MAX_TOKENS) as running:
        yield running


def cli_env() -> dict[str, str]:
    # No kubeconfig: with --url and --key the CLI must not need a cluster.
    return {**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig"}


def modelserve(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modelserve.cli.main", *args],
        input=input,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=CLI_SECONDS,
    )


def run_args(sidecar: Sidecar, *args: str, key: str = API_KEY) -> list[str]:
    return ["run", ENGINE_MODEL, *args, "--url", sidecar.url, "--key", key]


def png(path: Path) -> Path:
    """A real 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def test_run_with_a_prompt_streams_the_answer(sidecar: Sidecar) -> None:
    prompt = "Write a long story about a lighthouse keeper."
    process = subprocess.Popen(
        [sys.executable, "-m", "modelserve.cli.main", *run_args(sidecar, prompt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    pieces: list[bytes] = []
    deadline = time.monotonic() + CLI_SECONDS
    try:
        while time.monotonic() < deadline:
            piece = os.read(process.stdout.fileno(), 4096)  # what has arrived so far
            if not piece:
                break
            pieces.append(piece)
        assert process.wait(timeout=10) == 0, process.stderr.read()
    finally:
        stop_process(process)
        process.stdout.close()
        process.stderr.close()
    streamed = b"".join(pieces).decode()
    assert len(pieces) > 1, f"the answer came in one piece: {streamed!r}"  # printed as generated
    # The same answer the OpenAI client gets (temperature 0, the same token budget).
    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=ENGINE_MODEL, messages=[{"role": "user", "content": prompt}])
    assert streamed == reply.choices[0].message.content + "\n"


def counted(sidecar: Sidecar, requests: float) -> str:
    """The sidecar's metrics once it has counted `requests` answered chats (it counts a stream's
    usage as the stream ends, which may be just after the client has read it all)."""
    wait_until(lambda: metric_value(sidecar.metrics(), OK_REQUESTS) >= requests, 30, f"{requests} chats counted")
    return sidecar.metrics()


def test_chat_over_stdin_keeps_the_conversation_until_bye(sidecar: Sidecar) -> None:
    start = sidecar.metrics()
    lone = modelserve(*run_args(sidecar, "Say hi."))
    assert lone.returncode == 0 and lone.stdout.strip(), lone.stderr
    middle = counted(sidecar, metric_value(start, OK_REQUESTS) + 1)
    lone_tokens = metric_value(middle, PROMPT_TOKENS) - metric_value(start, PROMPT_TOKENS)
    result = modelserve(*run_args(sidecar), input="Say hi.\n\nSay hi.\n/bye\nnever sent\n")
    assert result.returncode == 0, result.stderr
    assert ">>>" not in result.stdout  # no prompt when stdin is no terminal
    assert len([line for line in result.stdout.splitlines() if line.strip()]) >= 2, result.stdout
    after = counted(sidecar, metric_value(middle, OK_REQUESTS) + 2)
    time.sleep(1)  # a third request (after /bye) would be counted by now
    assert metric_value(sidecar.metrics(), OK_REQUESTS) - metric_value(middle, OK_REQUESTS) == 2
    # The second turn carried the first exchange: more prompt tokens than two lone turns.
    sent = metric_value(after, PROMPT_TOKENS) - metric_value(middle, PROMPT_TOKENS)
    assert sent > 2 * lone_tokens > 0, (sent, lone_tokens)


def test_an_image_for_a_text_only_model_is_refused_and_the_chat_goes_on(sidecar: Sidecar, tmp_path: Path) -> None:
    picture = png(tmp_path / "dot.png")
    lines = f"/image {tmp_path / 'missing.png'} what is this?\n/image {picture} what is this?\nSay hi.\n/bye\n"
    result = modelserve(*run_args(sidecar), input=lines)
    assert result.returncode == 0, result.stderr
    assert f"no such file: {tmp_path / 'missing.png'}" in result.stderr
    assert f"error: {ENGINE_MODEL} is not a multimodal model" in result.stderr
    assert result.stdout.strip(), "the turn after the refusal got no answer"
    assert "Traceback" not in result.stderr


def test_a_wrong_key_exits_with_the_servers_message(sidecar: Sidecar) -> None:
    result = modelserve(*run_args(sidecar, "Say hi.", key="sk-wrong"))
    assert result.returncode == 1 and not result.stdout
    assert result.stderr == "modelserve run: 401 Invalid API key.\n"
    chat = modelserve(*run_args(sidecar, key="sk-wrong"), input="Say hi.\nSay hi.\n")
    assert chat.returncode == 1 and chat.stderr == "modelserve run: 401 Invalid API key.\n"


def test_nothing_listening_is_a_clear_error() -> None:
    (port,) = free_ports(1)
    result = modelserve("run", ENGINE_MODEL, "hi", "--url", f"http://127.0.0.1:{port}", "--key", "k")
    assert result.returncode == 1
    assert result.stderr.startswith(f"modelserve run: cannot reach http://127.0.0.1:{port}:"), result.stderr


# --- the translated TEMPLATE, rendered by llama.cpp's own Jinja engine -----------------------------

SEED_MODELFILE = '''FROM unsloth/gemma-3-270m-it-GGUF:Q4_K_M
TEMPLATE """<|startoftext|>{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}<|im_start|>user
{{ .Prompt }}<|im_end|>
<|im_start|>assistant
"""
PARAMETER stop <|im_end|>
PARAMETER stop <|endoftext|>
'''
MESSAGES_MODELFILE = '''FROM LiquidAI/LFM2-1.2B
TEMPLATE """<|startoftext|>{{ range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""
'''


@pytest.fixture(scope="module")
def render_with_llama_cpp(gguf_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """`render(chat_template, messages)`: the prompt llama.cpp builds with that template
    (a llama-server per template, asked through its /apply-template route)."""
    started = []

    def render(template: str, messages: list[dict[str, str]]) -> str:
        base = tmp_path_factory.mktemp("template")
        (base / "chat.jinja").write_text(template)
        (port,) = free_ports(1)
        extra = ("--chat-template-file", str(base / "chat.jinja"))
        engine = launch_engine(gguf_model, port, base, context=512, extra=extra)
        started.append(engine.process)
        engine.wait_serving(timeout=120)
        answer = httpx.post(engine.url + "/apply-template", json={"messages": messages}, timeout=30)
        assert answer.status_code == 200, answer.text
        stop_process(engine.process)
        return answer.json()["prompt"]

    yield render
    for process in started:
        stop_process(process)


def test_the_seed_template_renders_the_seed_layout_in_llama_cpp(render_with_llama_cpp) -> None:
    template = modelfile.to_manifest(SEED_MODELFILE, "chatty").manifest["spec"]["chatTemplate"]
    conversation = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]
    assert render_with_llama_cpp(template, conversation) == (
        "<|startoftext|><|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_messages_template_renders_every_turn_in_llama_cpp(render_with_llama_cpp) -> None:
    template = modelfile.to_manifest(MESSAGES_MODELFILE, "lfm").manifest["spec"]["chatTemplate"]
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert render_with_llama_cpp(template, conversation) == (
        "<|startoftext|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
