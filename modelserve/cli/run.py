"""`modelserve run`: one answer for a prompt, or a chat read line by line, as `ollama run` does.

The session keeps the conversation; `/bye` ends it, `/image PATH QUESTION` attaches an image.
A refused turn (400: e.g. an image for a text-only model) is reported and left out of the
conversation; any other failure (401, 404, 503 while loading, no connection) ends the run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from . import chat_client
from .chat_client import ChatError

PROMPT = ">>> "
HELP = "commands: /bye (leave), /image PATH QUESTION (ask about a local image), /clear (forget the conversation)"
# Refusals of one request, not of the session: the next turn may be fine.
TURN_REFUSALS = (400, 413, 422)

Chat = Callable[[list[dict[str, Any]], Callable[[str], None]], str]


def user_turn(line: str) -> dict[str, Any]:
    """The message for a typed line; `/image PATH QUESTION` adds the image (ValueError, OSError)."""
    if not line.startswith("/image"):
        return {"role": "user", "content": line}
    parts = line.split(maxsplit=2)
    if len(parts) < 3:
        raise ValueError("usage: /image PATH QUESTION")
    try:
        image = chat_client.image_part(parts[1])
    except FileNotFoundError:
        raise ValueError(f"no such file: {parts[1]}") from None
    return {"role": "user", "content": [{"type": "text", "text": parts[2]}, image]}


def _answer(chat: Chat, messages: list[dict[str, Any]], out: TextIO) -> str:
    def write(text: str) -> None:
        out.write(text)
        out.flush()

    answer = chat(messages, write)
    out.write("\n")
    out.flush()
    return answer


def once(chat: Chat, prompt: str, out: TextIO) -> None:
    _answer(chat, [{"role": "user", "content": prompt}], out)


def session(chat: Chat, lines: TextIO, out: TextIO, err: TextIO, interactive: bool) -> None:
    """Turns until /bye or the end of input; raises ChatError when the session cannot go on."""
    messages: list[dict[str, Any]] = []
    while True:
        if interactive:
            try:
                line = input(PROMPT)
            except EOFError:
                out.write("\n")
                return
        else:
            raw = lines.readline()
            if not raw:
                return
            line = raw
        line = line.strip()
        if not line:
            continue
        if line == "/bye":
            return
        if line == "/clear":
            messages = []
            err.write("conversation cleared\n")
            continue
        if line in ("/?", "/help"):
            err.write(HELP + "\n")
            continue
        if line.startswith("/") and line.split()[0] != "/image":
            err.write(f"unknown command {line.split()[0]}; {HELP}\n")
            continue
        try:
            turn = user_turn(line)
        except (ValueError, OSError) as error:
            err.write(f"{error}\n")
            continue
        try:
            answer = _answer(chat, [*messages, turn], out)
        except ChatError as error:
            if error.status not in TURN_REFUSALS:
                raise
            err.write(f"error: {error.message}\n")
            continue
        messages += [turn, {"role": "assistant", "content": answer}]


def run(url: str, model: str, key: str | None, prompt: str | None) -> None:
    """Against a reachable base URL; raises ChatError."""

    def chat(messages: list[dict[str, Any]], write: Callable[[str], None]) -> str:
        return chat_client.chat(url, model, key, messages, write)

    if prompt is not None:
        once(chat, prompt, sys.stdout)
    else:
        session(chat, sys.stdin, sys.stdout, sys.stderr, interactive=sys.stdin.isatty())
