"""docs/reference/cli.md: every command of `modelserve` with its arguments, read from its argparse parser
(rendered here as tables, not argparse's help text, which changes with the Python version)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from modelserve.cli import main as cli

from .markdown import code, generated_by, table


def commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command words, its one-line help, its parser) of every command, depth first. argparse keeps the
    subcommands in private attributes only."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:
                    continue  # an alias (ls for list)
                seen.add(id(sub))
                command = (*words, name)
                yield " ".join(command), helps.get(name, ""), sub
                yield from commands(sub, command)


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        metavar = action.metavar or action.dest
        return code(f"{metavar}..." if action.nargs == "+" else f"[{metavar}]" if action.nargs == "?" else metavar)
    takes = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    if action.choices and action.nargs != 0:
        takes = " {" + ",".join(map(str, action.choices)) + "}"
    return ", ".join(code(option + takes) for option in action.option_strings)


def _aliases(parser: argparse.ArgumentParser, name: str) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            target = action.choices.get(name)
            return [alias for alias, sub in action.choices.items() if sub is target and alias != name]
    return []


def page() -> str:
    root = cli._parser()
    lines = ["# The `modelserve` CLI", ""]
    lines += generated_by("hack/docgen/cli.py", "modelserve/cli/main.py's parser")
    lines += ["```text", (cli.__doc__ or "").strip(), "```", ""]
    parents = {"": root}
    for words, help_, parser in commands(root):
        parent_words, _, name = words.rpartition(" ")
        parents[words] = parser
        aliases = _aliases(parents[parent_words], name)
        lines += [f"## `modelserve {words}`", ""]
        description = parser.description or help_
        if description:
            lines += [description[0].upper() + description[1:], ""]
        if aliases:
            lines += [f"Also `modelserve {' '.join([*parent_words.split(), *aliases])}`.", ""]
        arguments = [
            (
                _argument(action),
                ("required: " if action.required and action.option_strings else "") + (action.help or ""),
            )
            for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if arguments:
            lines += [*table(("argument", "meaning"), arguments), ""]
    return "\n".join(lines)
