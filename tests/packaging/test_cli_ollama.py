"""`modelserve run|list|show|rm|create`: arguments, tables, the chat session, errors, the
port-forward (with a stand-in kubectl) and `create` as a user runs it. No cluster here: the real
node runs them in tests/realnode/test_cli_on_node.py, the real engine in tests/cli/test_cli_engine.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelserve.cli import chat_client
from modelserve.cli import cluster as cli_cluster
from modelserve.cli import main as cli
from modelserve.cli import run as cli_run
from modelserve.cli import views as cli_views
from modelserve.cli.chat_client import ChatError
from modelserve.cli.cluster import ClusterError
from modelserve_sandbox.processes import wait_until

CLI_SECONDS = 60
PLAIN_MODELFILE = "FROM unsloth/gemma-3-270m-it-GGUF:Q4_K_M\nPARAMETER temperature 0.1\nPARAMETER top_k 50\n"
SEED_MODELFILE = '''FROM unsloth/gemma-3-270m-it-GGUF:Q4_K_M
TEMPLATE """<|startoftext|>{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}<|im_start|>user
{{ .Prompt }}<|im_end|>
<|im_start|>assistant
"""
PARAMETER temperature 0.1
PARAMETER top_k 50
PARAMETER repeat_penalty 1.05
PARAMETER stop "<|im_end|>"
PARAMETER stop "<|endoftext|>"
'''


def modelserve(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modelserve.cli.main", *args],
        input=input,
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig", **(env or {})},
        timeout=CLI_SECONDS,
    )


# --- arguments ------------------------------------------------------------------------------------


def test_arguments_of_the_ollama_commands() -> None:
    parse = cli._parser().parse_args
    run = parse(["run", "chatty", "Say hello", "-n", "serving", "--url", "http://gw", "--key", ""])
    assert (run.name, run.prompt, run.namespace, run.url, run.key) == (
        "chatty",
        "Say hello",
        "serving",
        "http://gw",
        "",
    )
    chat = parse(["run", "chatty"])
    assert (chat.prompt, chat.namespace, chat.url, chat.key) == (None, None, None, None)
    assert parse(["list", "-A"]).all_namespaces and parse(["ls", "-n", "x"]).namespace == "x"
    assert parse(["list", "-o", "wide"]).output == "wide" and parse(["list"]).output is None
    create = parse(["create", "chatty", "-f", "Modelfile", "--profile", "cpu", "--apply"])
    assert (create.file, create.profile, create.apply, create.namespace) == ("Modelfile", "cpu", True, None)
    for wrong in (["list", "-A", "-n", "x"], ["create", "chatty"], ["create", "c", "-f", "M", "--profile", "gpu"]):
        with pytest.raises(SystemExit):
            parse(wrong)


# --- list and show --------------------------------------------------------------------------------

NOW = datetime(2025, 1, 2, 12, 0, 0, tzinfo=UTC)


def model_server(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2025-01-02T11:56:48Z"},
        "spec": {"model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "profile": "cpu", **spec},
        "status": {
            "phase": "Ready",
            "replicas": 1,
            "readyReplicas": 1,
            "endpoint": f"http://{name}.{namespace}.svc.cluster.local/v1",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "1/1 replicas ready"}],
        },
    }


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (119, "119s"), (192, "3m12s"), (600, "10m"), (3 * 3600 + 60, "3h1m"), (20 * 3600, "20h"),
     (3 * 86400 + 4 * 3600, "3d4h"), (12 * 86400, "12d"), (800 * 86400, "2y")],
)  # fmt: skip
def test_ages_read_like_kubectls(seconds: int, shown: str) -> None:
    assert cli_views.age(seconds) == shown


def test_list_is_a_table_like_kubectl_get() -> None:
    fresh = {"metadata": {"name": "new", "namespace": "b"}, "spec": {"model": "LiquidAI/LFM2-1.2B"}}
    table = cli_views.list_table([model_server("chatty", "b"), fresh], NOW, all_namespaces=False)
    assert table == (
        "NAME     MODEL                                 PROFILE           READY     REPLICAS   AGE\n"
        "chatty   unsloth/gemma-3-270m-it-GGUF:Q4_K_M   cpu               True      1          3m12s\n"
        "new      LiquidAI/LFM2-1.2B                    high-throughput   Unknown\n"
    )
    every = cli_views.list_table([model_server("b", "z"), model_server("a", "y")], NOW, all_namespaces=True)
    assert [line.split()[:2] for line in every.splitlines()] == [["NAMESPACE", "NAME"], ["y", "a"], ["z", "b"]]
    kept_back = model_server("chatty", "b")
    kept_back["status"]["versions"] = {"sidecar": "ghcr.io/modelserve/modelserve:0.1.0", "engine": "llama:b9093"}
    kept_back["status"]["upgrade"] = {"available": "Yes", "sidecar": "ghcr.io/modelserve/modelserve:0.2.0"}
    wide = cli_views.list_table([kept_back, fresh], NOW, all_namespaces=False, wide=True).splitlines()
    assert wide[0].split()[-4:] == ["AGE", "SIDECAR", "ENGINE", "UPGRADE"]
    assert wide[1].split()[-3:] == ["ghcr.io/modelserve/modelserve:0.1.0", "llama:b9093", "Yes"]
    assert wide[2].split() == ["new", "LiquidAI/LFM2-1.2B", "high-throughput", "Unknown"]


def test_show_says_the_model_settings_status_endpoints_and_where_the_key_is() -> None:
    ms = model_server("chatty", samplingDefaults={"temperature": 0.1, "stop": ["<|im_end|>"]}, maxModelLen=2048)
    ms["spec"]["chatTemplate"] = "{{ 'x' }}"
    ms["status"]["gatewayEndpoint"] = "http://modelserve-gateway.modelserve-system.svc.cluster.local/v1"
    assert cli_views.show(ms) == (
        "Name:       chatty\n"
        "Namespace:  default\n"
        "Model:      unsloth/gemma-3-270m-it-GGUF:Q4_K_M\n"
        "Profile:    cpu\n"
        "Context:    2048 tokens\n"
        "Vision:     no\n"
        "Status:     Ready (Ready=True Ready: 1/1 replicas ready)\n"
        "Replicas:   1/1 ready\n"
        "Endpoint:   http://chatty.default.svc.cluster.local/v1\n"
        "Gateway:    http://modelserve-gateway.modelserve-system.svc.cluster.local/v1\n"
        "API key:    in Secret chatty-api-keys, data key api-key\n"
        "Sampling defaults:\n"
        "  temperature: 0.1\n"
        '  stop: ["<|im_end|>"]\n'
        "Chat template:\n"
        "  {{ 'x' }}\n"
    )
    public = cli_views.show(model_server("open", auth={"mode": "public"}))
    assert "API key:    none needed (auth.mode public)\n" in public
    named = cli_views.show(model_server("team", auth={"secretName": "team-keys"}))
    assert "API key:    in Secret team-keys\n" in named


def test_show_says_which_images_run_and_which_an_upgrade_kept_back() -> None:
    ms = model_server("chatty")
    ms["status"]["versions"] = {"sidecar": "ghcr.io/modelserve/modelserve:0.1.0", "engine": "llama:b1"}
    assert "Sidecar:    ghcr.io/modelserve/modelserve:0.1.0\nEngine:     llama:b1\n" in cli_views.show(ms)
    assert "Upgrade:" not in cli_views.show(ms)
    ms["status"]["upgrade"] = {"available": "Yes", "sidecar": "ghcr.io/modelserve/modelserve:0.2.0", "message": "m"}
    assert "Upgrade:    available: ghcr.io/modelserve/modelserve:0.2.0 (m)\n" in cli_views.show(ms)
    ms["status"]["versions"]["sidecarWorkers"] = 1
    ms["status"]["upgrade"] = {"available": "Yes", "sidecarWorkers": 3, "message": "m"}
    assert "Sidecar:    ghcr.io/modelserve/modelserve:0.1.0\n" in cli_views.show(ms)  # one worker: as ever
    assert "Upgrade:    available: 3 sidecar workers (m)\n" in cli_views.show(ms)
    ms["status"]["versions"]["sidecarWorkers"] = 3
    assert "Sidecar:    ghcr.io/modelserve/modelserve:0.1.0 (3 workers)\n" in cli_views.show(ms)


def test_the_key_comes_from_the_secret_the_modelserver_names() -> None:
    assert cli_cluster.key_secret(model_server("chatty")) == ("chatty-api-keys", "api-key")
    assert cli_cluster.key_secret(model_server("t", auth={"mode": "private", "secretName": "keys"})) == ("keys", "")
    assert cli_cluster.key_secret(model_server("p", auth={"mode": "public"})) is None
    assert cli_cluster.first_key({"api-key": " msk-1\n"}, "api-key") == "msk-1"
    # A named Secret: the first non-empty line of its first data entry (entries in name order).
    assert cli_cluster.first_key({"b": "k3", "a": "\n  \nk1\nk2\n"}, "") == "k1"
    assert cli_cluster.first_key({"a": "\n"}, "") is None


# --- the chat session -----------------------------------------------------------------------------


class FakeChat:
    """Answers "answer N", or raises the next queued error; records what each turn sent."""

    def __init__(self, errors: list[ChatError | None] | None = None) -> None:
        self.sent: list[list[dict[str, Any]]] = []
        self.errors = errors or []

    def __call__(self, messages: list[dict[str, Any]], write: Callable[[str], None]) -> str:
        self.sent.append(messages)
        error = self.errors.pop(0) if self.errors else None
        if error:
            raise error
        text = f"answer {len(self.sent)}"
        write(text[:3])
        write(text[3:])
        return text


def chat_session(lines: str, chat: FakeChat) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    cli_run.session(chat, io.StringIO(lines), out, err, interactive=False)
    return out.getvalue(), err.getvalue()


def test_a_session_keeps_the_conversation_and_ends_at_bye() -> None:
    chat = FakeChat()
    out, err = chat_session("Hi\n\n  Who are you?  \n/bye\nnot sent\n", chat)
    assert out == "answer 1\nanswer 2\n" and err == ""
    assert chat.sent[1] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "Who are you?"},
    ]
    assert len(chat.sent) == 2
    # The end of input ends it too; /clear forgets.
    chat = FakeChat()
    chat_session("Hi\n/clear\nAgain\n", chat)
    assert chat.sent[1] == [{"role": "user", "content": "Again"}]


def test_a_refused_turn_is_reported_and_left_out(tmp_path: Path) -> None:
    picture = tmp_path / "dot.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    chat = FakeChat([ChatError(400, "chatty is not a multimodal model")])
    lines = f"/image {tmp_path}/nope.png what?\n/image {picture} what is it?\n/image {picture}\n/set x\nHi\n"
    out, err = chat_session(lines, chat)
    assert err.splitlines() == [
        f"no such file: {tmp_path}/nope.png",
        "error: chatty is not a multimodal model",
        "usage: /image PATH QUESTION",
        f"unknown command /set; {cli_run.HELP}",
    ]
    image_turn = chat.sent[0][0]["content"]
    assert image_turn[0] == {"type": "text", "text": "what is it?"}
    assert image_turn[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert chat.sent[1] == [{"role": "user", "content": "Hi"}] and out == "answer 2\n"


def test_a_session_ends_on_any_other_failure() -> None:
    with pytest.raises(ChatError) as error:
        chat_session("Hi\nHi again\n", FakeChat([None, ChatError(503, "Model is loading.")]))
    assert error.value.status == 503


def test_an_image_must_be_one() -> None:
    with pytest.raises(ValueError, match="is not a PNG, JPEG, GIF or WebP image"):
        chat_client.image_part(__file__)


# --- the HTTP side --------------------------------------------------------------------------------


def test_stream_lines_and_server_messages_are_read_as_sent() -> None:
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n',
        b"\n",
        b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n',
        b'data: {"choices":[{"delta":{"content":"lo"}}]}\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n',
        b"data: [DONE]\n",
        b'data: {"choices":[{"delta":{"content":"never"}}]}\n',
    ]
    written: list[str] = []
    assert chat_client.stream_lines(events, written.append) == "Hello" and written == ["Hel", "lo"]
    with pytest.raises(ChatError, match="engine gone"):
        chat_client.stream_lines([b'data: {"error": {"message": "engine gone"}}\n'], written.append)
    assert chat_client.error_message(b'{"error": {"message": "Invalid API key."}}', "x") == "Invalid API key."
    assert chat_client.error_message(b'{"error": "model \\"m\\" not found"}', "x") == 'model "m" not found'
    assert chat_client.error_message(b"upstream said no", "x") == "upstream said no"
    assert chat_client.error_message(b"", "Not Found") == "Not Found"
    assert chat_client.base_url("http://h:1/") == chat_client.base_url("http://h:1/v1") == "http://h:1/v1"


@pytest.fixture
def refusing_server() -> Iterator[Callable[[int, dict[str, Any]], str]]:
    """A local server answering every POST with one status and JSON body; returns its URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int, body: dict[str, Any]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (
            404,
            {"error": 'model "other" not found, try pulling it first'},
            'model "other" not found, try pulling it first',
        ),
        (503, {"error": {"message": "Model is loading.", "code": "model_loading"}}, "Model is loading."),
    ],
)
def test_run_prints_the_servers_refusal_and_exits_non_zero(refusing_server, status: int, body: dict, said: str) -> None:
    url = refusing_server(status, body)
    result = modelserve("run", "other", "hi", "--url", url, "--key", "k")
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"modelserve run: {status} {said}\n")


def test_run_without_a_cluster_or_key_says_so() -> None:
    result = modelserve("run", "chatty", "hi", "--url", "http://127.0.0.1:9")
    assert result.returncode == 1 and result.stderr.startswith("modelserve run: no cluster to talk to:")
    assert "Traceback" not in result.stderr
    for command in (["list"], ["show", "x"], ["rm", "x"], ["run", "x"]):
        other = modelserve(*command)
        assert other.returncode == 1 and other.stderr.startswith(f"modelserve {command[0]}: no cluster to talk to")


def test_ctrl_c_in_a_chat_ends_it_quietly() -> None:
    # The chat starts with SIGINT at its default, as a terminal's foreground job has it. A job that a
    # non-interactive shell started in the background (CI's runner may be one) ignores SIGINT, its
    # children inherit that, and Python keeps an ignored SIGINT ignored: the chat then read the end of
    # its input and exited 0, or waited out the timeout. A handler, unlike SIG_IGN, is not inherited.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "modelserve.cli.main", "run", "x", "--url", "http://127.0.0.1:9", "--key", "k"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        # Interrupted once it waits for a line: blocked in read(2) on its standard input. Its input
        # stays open until it has exited, so the end of input cannot end the chat first.
        wait_until(lambda: reading_stdin(process.pid), CLI_SECONDS, "the chat to wait for a line", interval=0.05)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=CLI_SECONDS)
        err = process.stderr.read()  # type: ignore[union-attr]
    finally:
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            pipe.close()  # type: ignore[union-attr]
    assert process.returncode == 130 and "Traceback" not in err, (process.returncode, err)


def reading_stdin(pid: int) -> bool:
    """The process is blocked in read(2) on file descriptor 0 (/proc/PID/syscall: number, then args)."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return fields[:2] == ["0", "0x0"]


# --- the port-forward, with a stand-in kubectl ----------------------------------------------------


def fake_kubectl(bin_dir: Path, script: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!/bin/sh\n" + script)
    kubectl.chmod(0o755)
    return kubectl


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_port_forward_runs_kubectl_and_stops_it_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args_file, pid_file = tmp_path / "args", tmp_path / "pid"
    fake_kubectl(
        tmp_path / "bin",
        f'echo "$@" > {args_file}\necho $$ > {pid_file}\n'
        'echo "Forwarding from 127.0.0.1:43210 -> 8000"\necho "Forwarding from [::1]:43210 -> 8000"\n'
        "exec sleep 60\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with cli_cluster.port_forward("chatty", "serving") as url:
        assert url == "http://127.0.0.1:43210"
        pid = int(pid_file.read_text())
        assert alive(pid)
        assert args_file.read_text().split() == ["port-forward", "-n", "serving", "svc/chatty", ":80"]
    assert not alive(pid)
    # Stopped on the way out of a failure (Ctrl-C is one) as well.
    with pytest.raises(KeyboardInterrupt), cli_cluster.port_forward("chatty", "serving"):
        pid = int(pid_file.read_text())
        raise KeyboardInterrupt
    assert not alive(pid)


def test_port_forward_failures_are_kubectls_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kubectl(tmp_path / "bin", "echo 'error: services \"chatty\" not found' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ClusterError) as error, cli_cluster.port_forward("chatty", "serving"):
        pass
    assert str(error.value) == 'kubectl port-forward failed: error: services "chatty" not found'
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ClusterError) as error, cli_cluster.port_forward("chatty", "serving"):
        pass
    assert str(error.value) == "kubectl is not on PATH: install it, or pass --url to reach the model another way"


# --- create ---------------------------------------------------------------------------------------


def test_create_prints_a_modelserver_the_spec_model_accepts(tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(PLAIN_MODELFILE + "PARAMETER num_thread 4\n")
    result = modelserve("create", "chatty", "-f", str(tmp_path / "Modelfile"), "--profile", "cpu", "-n", "serving")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert manifest == {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "chatty", "namespace": "serving"},
        "spec": {
            "model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M",
            "profile": "cpu",
            "samplingDefaults": {"temperature": 0.1, "topK": 50},
        },
    }
    ms = cli.parse_model_server(manifest, "serving")
    assert ms.spec.sampling_defaults.top_k == 50
    assert result.stderr.startswith("modelserve create: warning: line 4: PARAMETER num_thread ignored:")
    # From stdin; a :<quant> tag (a GGUF file) without --profile: cpu, the profile that serves one.
    piped = modelserve("create", "chatty", "-f", "-", input=PLAIN_MODELFILE)
    assert piped.returncode == 0 and yaml.safe_load(piped.stdout)["spec"]["profile"] == "cpu"


@pytest.mark.parametrize(
    ("modelfile", "args", "said"),
    [
        (
            PLAIN_MODELFILE.replace("temperature 0.1", "temperature 5"),
            [],
            'modelserve create: ModelServer "chatty" is invalid:\n'
            "spec.samplingDefaults.temperature: Input should be less than or equal to 2 (Modelfile line 2)\n",
        ),
        (
            PLAIN_MODELFILE,
            ["--profile", "high-throughput"],
            'modelserve create: ModelServer "chatty" is invalid:\n'
            "spec.model: model takes a :<quant> tag only with profile cpu (a GGUF repo for llama.cpp) "
            "(Modelfile line 1)\n",
        ),
        (
            "FROM ./gemma.gguf\n",
            [],
            "modelserve create: line 1: FROM ./gemma.gguf is a file on this machine, which a cluster cannot serve: "
            "use a Hugging Face repo id (e.g. unsloth/gemma-3-270m-it-GGUF:Q4_K_M or LiquidAI/LFM2-1.2B)\n",
        ),
    ],
)
def test_create_refuses_naming_the_field_and_the_line(tmp_path: Path, modelfile: str, args: list, said: str) -> None:
    (tmp_path / "Modelfile").write_text(modelfile)
    result = modelserve("create", "chatty", "-f", str(tmp_path / "Modelfile"), *args)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", said)


def test_create_refuses_a_bad_name_and_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(PLAIN_MODELFILE)
    bad = modelserve("create", "Chatty_1", "-f", str(tmp_path / "Modelfile"), "--profile", "cpu")
    assert bad.returncode == 1 and "metadata.name: metadata.name must be a DNS-1035 label" in bad.stderr
    missing = modelserve("create", "chatty", "-f", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr


def test_create_with_template_and_stop_passes_validation(tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(SEED_MODELFILE)
    result = modelserve("create", "chatty", "-f", str(tmp_path / "Modelfile"), "--profile", "cpu")
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)["spec"]
    assert spec["samplingDefaults"]["stop"] == ["<|im_end|>", "<|endoftext|>"]
    assert spec["chatTemplate"].startswith("{% set ns = namespace(")
