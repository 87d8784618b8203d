"""Ollama's Go chat templates (a Modelfile's TEMPLATE) as Jinja chat templates over `messages`.

Pure functions. The engines render Hugging Face style Jinja templates (`messages`,
`add_generation_prompt`); Ollama renders Go templates with either

- the legacy variables `.System`, `.Prompt`, `.Response`: the template is executed once per
  exchange (a system text, a user prompt, an answer), and for the last exchange only up to
  `{{ .Response }}`, which leaves the answer's header as the generation prompt; or
- `{{ range .Messages }}` with `.Role` and `.Content` (and `.System`, the system texts joined).

The Jinja produced replays exactly that. Its literal text is written as string expressions with no
text between tags, so the engines' whitespace options (`trim_blocks`, `lstrip_blocks`) cannot
change a byte. Everything else Go templates can say (pipelines, functions, variables, `.Tools`,
`with`, ...) is refused naming the construct and its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SUPPORTED = (
    "{{ .System }}, {{ .Prompt }}, {{ .Response }}, {{ if .X }}/{{ else }}/{{ end }}, "
    "{{ range .Messages }} with {{ .Role }} and {{ .Content }}, {{/* comments */}} and {{- -}} trimming"
)
TOP_FIELDS = ("System", "Prompt", "Response")
MESSAGE_FIELDS = ("Role", "Content")
GO_SPACE = " \t\r\n"
# An action: `{{`, an optional left trim `- `, the body, an optional right trim ` -`, `}}`.
ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.S)
KEYWORDS = ("with", "template", "define", "block", "break", "continue", "range", "if", "else", "end", "nil")


class TemplateError(ValueError):
    """A Go template this module cannot translate; the message names the construct and its line."""


@dataclass
class Text:
    text: str


@dataclass
class Field:
    name: str  # System, Prompt, Response, Role or Content
    line: int


@dataclass
class If:
    field: Field
    then: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)
    chained: bool = False  # opened by `else if`: closed by the same `end` as its parent
    in_else: bool = False


@dataclass
class Range:
    line: int
    body: list[Node] = field(default_factory=list)


Node = Text | Field | If | Range


def _refusal(action: str, line: int, why: str) -> TemplateError:
    return TemplateError(f"line {line}: {{{{ {action} }}}} is not supported ({why}); supported: {SUPPORTED}")


def _why_unsupported(action: str) -> str:
    """Names the Go template construct an action uses, for the refusal."""
    words = action.split()
    first = words[0] if words else ""
    if "|" in action:
        return "a pipeline"
    if "$" in action:
        return "a variable"
    if first in ("if", "range", "with") and len(words) > 1:
        return f"{first} over {_why_unsupported(' '.join(words[1:]))}"
    if first in KEYWORDS:
        return f"the action {first}"
    if first.startswith("."):
        return f"the field {first}"
    if re.match(r"^[A-Za-z_]\w*$", first):
        return f"the function {first}"
    return "this expression"


def _field(token: str, action: str, line: int, in_range: bool) -> Field:
    """`.Name` (the token of `action`) as a Field, if the context has that variable."""
    allowed = MESSAGE_FIELDS if in_range else TOP_FIELDS
    name = token[1:] if token.startswith(".") else ""
    if name in allowed:
        return Field(name, line)
    if name in TOP_FIELDS + MESSAGE_FIELDS:
        where = "inside range .Messages a message has only .Role and .Content" if in_range else "only inside range"
        raise _refusal(action, line, f"the field {token}: {where}")
    raise _refusal(action, line, _why_unsupported(action))


def parse(template: str, first_line: int = 1) -> list[Node]:
    """The template as nodes; `first_line` is the line the template starts on (for messages)."""
    root: list[Node] = []
    stack: list[If | Range] = []  # open blocks, innermost last

    def children() -> list[Node]:
        if not stack:
            return root
        block = stack[-1]
        if isinstance(block, Range):
            return block.body
        return block.orelse if block.in_else else block.then

    def in_range() -> bool:
        return any(isinstance(block, Range) for block in stack)

    def add_text(text: str) -> None:
        if text:
            children().append(Text(text))

    position = 0
    trim_next = False
    for match in ACTION.finditer(template):
        line = first_line + template.count("\n", 0, match.start())
        text = template[position : match.start()]
        if trim_next:
            text = text.lstrip(GO_SPACE)
        if match.group(1):
            text = text.rstrip(GO_SPACE)
        add_text(text)
        position, trim_next = match.end(), bool(match.group(3))
        action = match.group(2).strip()
        if action.startswith("/*") and action.endswith("*/"):
            continue
        words = action.split()
        if action.startswith("."):
            children().append(_field(action, action, line, in_range()))
        elif words[:1] == ["if"] and len(words) == 2:
            block = If(_field(words[1], action, line, in_range()))
            children().append(block)
            stack.append(block)
        elif words[:2] == ["else", "if"] and len(words) == 3 and stack and isinstance(stack[-1], If):
            block = If(_field(words[2], action, line, in_range()), chained=True)
            stack[-1].in_else = True
            children().append(block)
            stack.append(block)
        elif words == ["else"] and stack and isinstance(stack[-1], If) and not stack[-1].in_else:
            stack[-1].in_else = True
        elif words == ["range", ".Messages"] and not in_range():
            block = Range(line)
            children().append(block)
            stack.append(block)
        elif words == ["end"] and stack:
            while isinstance(stack[-1], If) and stack[-1].chained:
                stack.pop()
            stack.pop()
        elif words and words[0] in ("else", "end"):
            raise TemplateError(f"line {line}: {{{{ {action} }}}} has no open {{{{ if }}}} or {{{{ range }}}}")
        else:
            raise _refusal(action, line, _why_unsupported(action))
    if "{{" in template[position:]:
        line = first_line + template.count("\n", 0, template.index("{{", position))
        raise TemplateError(f"line {line}: an action opened with {{{{ is not closed with }}}}")
    tail = template[position:]
    add_text(tail.lstrip(GO_SPACE) if trim_next else tail)
    if stack:
        opened = stack[-1]
        line = opened.line if isinstance(opened, Range) else opened.field.line
        raise TemplateError(f"line {line}: this {{{{ if }}}} or {{{{ range }}}} has no {{{{ end }}}}")
    return root


def _walk(nodes: list[Node]) -> list[Node]:
    out: list[Node] = []
    for node in nodes:
        out.append(node)
        if isinstance(node, If):
            out += _walk(node.then) + _walk(node.orelse)
        elif isinstance(node, Range):
            out += _walk(node.body)
    return out


def cut_at_response(nodes: list[Node], cut: bool = False) -> tuple[list[Node], bool]:
    """What Ollama executes for the last exchange: the template up to `{{ .Response }}`, every
    node after it (in document order, through ifs) left out. Returns the nodes and whether it cut."""
    out: list[Node] = []
    for node in nodes:
        if cut:
            break
        if isinstance(node, Field) and node.name == "Response":
            cut = True
        elif isinstance(node, If):
            then, cut = cut_at_response(node.then)
            orelse, cut = ([], True) if cut else cut_at_response(node.orelse)
            out.append(If(node.field, then, orelse))
        else:
            out.append(node)
    return out, cut


def jinja_string(text: str) -> str:
    """A Jinja string literal (jinja2 and llama.cpp's minja read the same escapes)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return "'" + escaped.replace("\t", "\\t") + "'"


VARIABLES = {
    "System": "ns.system",
    "Prompt": "ns.prompt",
    "Response": "ns.response",
    "Role": "message.role",
    "Content": "message.content",
}


def emit(nodes: list[Node]) -> str:
    out = ""
    for node in nodes:
        if isinstance(node, Text):
            out += "{{ " + jinja_string(node.text) + " }}"
        elif isinstance(node, Field):
            out += "{{ " + VARIABLES[node.name] + " }}"
        elif isinstance(node, If):
            out += "{% if " + VARIABLES[node.field.name] + " %}" + emit(node.then)
            out += ("{% else %}" + emit(node.orelse) if node.orelse else "") + "{% endif %}"
        else:
            out += "{% for message in messages %}" + emit(node.body) + "{% endfor %}"
    return out


RESET = "{% set ns.system = '' %}{% set ns.prompt = '' %}{% set ns.response = '' %}"


def _legacy(nodes: list[Node]) -> str:
    """Ollama's loop over exchanges: a system or user turn after an answer (or a system turn after
    a prompt) executes the template for the exchange so far; the last one is cut at .Response."""
    full = emit(nodes)
    cut = emit(cut_at_response(nodes)[0])
    return (
        "{% set ns = namespace(system='', prompt='', response='') %}"
        "{% for message in messages %}"
        "{% if message.role == 'system' %}"
        "{% if ns.prompt or ns.response %}" + full + RESET + "{% endif %}"
        "{% set ns.system = message.content %}"
        "{% elif message.role == 'user' %}"
        "{% if ns.response %}" + full + RESET + "{% endif %}"
        "{% set ns.prompt = message.content %}"
        "{% elif message.role == 'assistant' %}"
        "{% set ns.response = message.content %}"
        "{% endif %}"
        "{% endfor %}"
        # Without a generation prompt the last exchange is written whole.
        "{% if add_generation_prompt %}" + cut + "{% else %}" + full + "{% endif %}"
    )


# Ollama's .System beside .Messages: every system message's text, joined by a blank line.
JOINED_SYSTEM = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}{% if message.role == 'system' %}"
    "{% if ns.system %}{% set ns.system = ns.system + '\\n\\n' %}{% endif %}"
    "{% set ns.system = ns.system + message.content %}"
    "{% endif %}{% endfor %}"
)


def _messages(nodes: list[Node]) -> str:
    """The range form: what follows the last top-level range is the generation prompt."""
    last = (
        max(i for i, node in enumerate(nodes) if isinstance(node, Range))
        if any(isinstance(node, Range) for node in nodes)
        else len(nodes) - 1
    )
    uses_system = any(isinstance(n, Field | If) and _name(n) == "System" for n in _walk(nodes))
    head = JOINED_SYSTEM if uses_system else ""
    tail = emit(nodes[last + 1 :])
    return head + emit(nodes[: last + 1]) + ("{% if add_generation_prompt %}" + tail + "{% endif %}" if tail else "")


def _name(node: Field | If) -> str:
    return node.name if isinstance(node, Field) else node.field.name


def to_jinja(template: str, first_line: int = 1) -> str:
    """The Jinja chat template that renders `messages` as Ollama renders the Go `template`."""
    nodes = parse(template, first_line)
    everything = _walk(nodes)
    ranges = [node for node in everything if isinstance(node, Range)]
    legacy = [n for n in everything if isinstance(n, Field | If) and _name(n) in ("Prompt", "Response")]
    if ranges and legacy:
        node = legacy[0]
        line = node.line if isinstance(node, Field) else node.field.line
        raise TemplateError(
            f"line {line}: .{_name(node)} next to range .Messages (line {ranges[0].line}): "
            "Ollama fills one or the other, so use one form"
        )
    return _messages(nodes) if ranges else _legacy(nodes)
