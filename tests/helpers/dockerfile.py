"""Reading the Dockerfile: its instructions, split into build stages (no container engine here)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, e.g. RUN
    arguments: str  # continuation lines joined


def instructions(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, backslash continuations joined."""
    out: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            keyword, _, arguments = pending.partition(" ")
            out.append(Instruction(keyword.upper(), arguments.strip()))
            pending = ""
    return out


def stages(path: Path) -> list[list[Instruction]]:
    """One list per FROM (the FROM first); instructions before the first FROM (ARGs) are dropped."""
    result: list[list[Instruction]] = []
    for instruction in instructions(path.read_text()):
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def env_of(stage: list[Instruction]) -> dict[str, str]:
    """The stage's ENV settings (KEY=VALUE form)."""
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(instruction.arguments))
    return env
