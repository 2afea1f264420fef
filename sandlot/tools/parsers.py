"""Tool-call parsers: read the tool calls out of a model's text, and render calls back.

Two formats, as the chat templates of the model families write them:

* ``hermes`` (Hermes, Qwen2.5, Qwen3): one JSON object per call inside tags::

      <tool_call>
      {"name": "bash", "arguments": {"command": "ls"}}
      </tool_call>

* ``qwen3_coder`` (Qwen3-Coder): XML-like tags, one value per parameter::

      <tool_call>
      <function=bash>
      <parameter=command>
      ls
      </parameter>
      </function>
      </tool_call>

  A value is the text between the tags minus one leading and one trailing newline. It is
  converted with the function's JSON schema the way vLLM's ``qwen3_coder`` parser does:
  ``string`` stays text; ``integer``/``number``/``boolean``/``null`` are parsed; ``array`` and
  ``object`` are read as JSON (then as a Python literal); anything that does not convert, and
  parameters the schema does not know, stay text for argument validation to judge. A value
  containing ``</parameter>`` cannot be written in this format.

Reasoning (Qwen3, DeepSeek-R1 style ``<think>...</think>``) is split off before the calls are
read, by the decision rules of vLLM 0.24's ``BaseThinkingReasoningParser.extract_reasoning``
(``vllm/reasoning/basic_parsers.py``, lines 157-181; the ``deepseek_r1`` reasoning parser): text
up to a first ``<think>`` is dropped; the reasoning runs to the first ``</think>``; a block
never closed is all reasoning. A ``<tool_call>`` the model drafts inside it is therefore not
executed (the reasoning stays in the trajectory, as the reply's text). Text without either tag
is all answer, unless ``reasoning_opened`` says the chat template itself opened the block
(DeepSeek-R1, Qwen3 "thinking" checkpoints end the generation prompt with ``<think>``): then
it is all reasoning, as vLLM's ``deepseek_r1`` parser reads it. (vLLM 0.24's ``qwen3`` engine
parser differs: it ends the reasoning at a ``<tool_call>`` and calls it; sandlot does not.)

A last ``<tool_call>`` left unclosed at the end of the text is read as vLLM's ``hermes`` parser
reads it (``vllm/tool_parsers/hermes_tool_parser.py``, the ``tool_call_regex`` alternative
``<tool_call>(.*)``): the call is taken when what follows the tag parses. For ``qwen3_coder``
the call is taken even when cut inside its ``<function=NAME>`` (vLLM's parser engine ends an
open call at the end of the text, ``vllm/parser/engine/streaming_parser_engine.py``
``finish``), with only its closed parameters: a value running to the end may be cut short.

``parse`` never raises: text with broken tool-call markup gives a :class:`ParsedResponse` with
``error`` set, for the toolbox to turn into a ``format_error`` observation.
"""

from __future__ import annotations

import abc
import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

THINK_START = "<think>"
THINK_END = "</think>"
# A closed call, or (vLLM hermes' second alternative) a last one left open to the end.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
# A last call cut off before </function>: only parameters that are closed (or followed by
# another) count, as vLLM 0.24's qwen3 converter reads them (``vllm/parser/qwen3.py``
# ``_PARAM_RE``, lines 53-58); a value running to the end of the text may be cut short.
_OPEN_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)", re.DOTALL)
_CLOSED_PARAMETER = re.compile(
    r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=))", re.DOTALL
)
_INT = re.compile(r"^[+-]?\d+$")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedResponse:
    """A model turn split into its text and its tool calls.

    Attributes:
        content: the text outside the tool calls, stripped.
        calls: the tool calls in order (those that parsed, when ``error`` is set).
        error: why the tool-call markup could not be read, or ``None``.
    """

    content: str
    calls: list[ToolCall]
    error: str | None = None
    reasoning: str | None = None


def split_reasoning(text: str, *, opened: bool = False) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a reply (see the module docstring for the rules).

    Args:
        text: the reply as the model wrote it.
        opened: the chat template opened the reasoning block (text without tags is reasoning).

    Returns:
        The reasoning (``None`` when there is none) and the text after it, where calls are read.
    """
    if not opened and THINK_START not in text and THINK_END not in text:
        return None, text
    before, start, after = text.partition(THINK_START)
    body = after if start else before
    reasoning, end, answer = body.partition(THINK_END)
    return reasoning, answer if end else ""


def _format_error(reason: str, example: str) -> str:
    return f"Your tool call could not be parsed: {reason}. Write each call as:\n{example}"


class ToolCallParser(abc.ABC):
    """Reads and writes one tool-call format.

    Args:
        schemas: the OpenAI ``tools`` list the calls follow (used for type conversion).
        reasoning_opened: the chat template opens the reasoning block (module docstring).
    """

    name: ClassVar[str]
    example: ClassVar[str]

    def __init__(
        self, schemas: Sequence[Mapping[str, Any]] = (), *, reasoning_opened: bool = False
    ) -> None:
        self.reasoning_opened = reasoning_opened
        self.properties: dict[str, dict[str, Any]] = {}
        for schema in schemas:
            function = schema.get("function", schema)
            self.properties[function["name"]] = function.get("parameters", {}).get("properties", {})

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into reasoning, content and the tool calls after the reasoning;
        never raises."""
        reasoning, answer = split_reasoning(text, opened=self.reasoning_opened)
        parsed = self._parse(answer)
        return ParsedResponse(parsed.content, parsed.calls, parsed.error, reasoning)

    @abc.abstractmethod
    def _parse(self, text: str) -> ParsedResponse:
        """Split the answer (no reasoning in it) into content and tool calls."""

    @abc.abstractmethod
    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The text a model of this format writes for ``content`` followed by ``calls``."""

    def _error(self, reason: str, content: str, calls: list[ToolCall]) -> ParsedResponse:
        return ParsedResponse(content, calls, _format_error(reason, self.example))


def _outside(text: str, pattern: re.Pattern[str]) -> str:
    return pattern.sub("", text).strip()


def _body(match: re.Match[str]) -> str:
    """A call's text: between the tags, or after an unclosed last ``<tool_call>``."""
    closed = match.group(1)
    return closed if closed is not None else match.group(2)


def _json_calls(text: str) -> tuple[str, list[str]]:
    """The text outside ``<tool_call>`` blocks and each block's body. A body that is one JSON
    value followed by ``</tool_call>`` (or by the end of the text) ends after that value, so a
    ``</tool_call>`` inside a JSON string (a file being written) does not close the block, as
    vLLM's ``(.*?)</tool_call>`` would; any other body runs to the next ``</tool_call>``, or to
    the end for an unclosed last call, as vLLM reads it."""
    outside: list[str] = []
    bodies: list[str] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) >= 0:
        outside.append(text[pos:start])
        begin = start + len(_OPEN)
        end = _json_end(text, begin)
        after = end + len(text[end:]) - len(text[end:].lstrip()) if end is not None else -1
        if end is not None and text.startswith(_CLOSE, after):
            bodies.append(text[begin:end])
            pos = after + len(_CLOSE)
            continue
        close = text.find(_CLOSE, begin) if after != len(text) else -1
        bodies.append(text[begin:] if close < 0 else text[begin:close])
        pos = len(text) if close < 0 else close + len(_CLOSE)
    outside.append(text[pos:])
    return "".join(outside).strip(), bodies


def _json_end(text: str, begin: int) -> int | None:
    """Where the JSON value starting at ``begin`` (after whitespace) ends, or ``None``."""
    index = begin + len(text[begin:]) - len(text[begin:].lstrip())
    try:
        return _DECODER.raw_decode(text, index)[1]
    except json.JSONDecodeError:
        return None


class HermesParser(ToolCallParser):
    """JSON calls in ``<tool_call>`` tags (Hermes / Qwen2.5 / Qwen3 chat templates)."""

    name: ClassVar[str] = "hermes"
    example: ClassVar[str] = (
        '<tool_call>\n{"name": "<tool name>", "arguments": {"<parameter>": <value>}}\n</tool_call>'
    )

    def _parse(self, text: str) -> ParsedResponse:
        content, bodies = _json_calls(text)
        calls: list[ToolCall] = []
        for body in bodies:
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as exc:
                return self._error(f"invalid JSON inside <tool_call> ({exc})", content, calls)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return self._error('the JSON needs a string "name"', content, calls)
            arguments = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError as exc:
                    return self._error(f'"arguments" is not valid JSON ({exc})', content, calls)
            if not isinstance(arguments, dict):
                return self._error('"arguments" must be a JSON object', content, calls)
            calls.append(ToolCall(obj["name"], arguments))
        if "</tool_call>" in content:
            return self._error("a </tool_call> tag has no <tool_call>", content, calls)
        return ParsedResponse(content, calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        blocks = [
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
            for c in calls
        ]
        return "\n".join([content.strip(), *blocks] if content.strip() else blocks)


def _types(schema: Mapping[str, Any] | None) -> set[str]:
    if not schema:
        return set()
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key, ()):
            found |= _types(option)
    if "enum" in schema and not found:
        found.add("string")
    return found


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """Convert a ``qwen3_coder`` parameter's text with its JSON schema (see the module doc)."""
    types = _types(schema)
    if not types or types == {"string"}:
        return raw
    value = raw.strip()
    if "null" in types and value.lower() in ("null", "none"):
        return None
    if "boolean" in types and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if "integer" in types and _INT.match(value):
        return int(value)
    if "number" in types:
        try:
            return int(value) if _INT.match(value) else float(value)
        except ValueError:
            pass
    if types & {"array", "object"}:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            try:
                return ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                pass
    return raw


def _render_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Qwen3CoderParser(ToolCallParser):
    """``<function=...><parameter=...>`` calls (Qwen3-Coder chat template)."""

    name: ClassVar[str] = "qwen3_coder"
    example: ClassVar[str] = (
        "<tool_call>\n<function=<tool name>>\n<parameter=<parameter name>>\n<value>\n"
        "</parameter>\n</function>\n</tool_call>"
    )

    def _parse(self, text: str) -> ParsedResponse:
        content = _outside(text, _TOOL_CALL)
        calls: list[ToolCall] = []
        for match in _TOOL_CALL.finditer(text):
            body = _body(match)
            functions = [(f, _PARAMETER) for f in _FUNCTION.finditer(body)]
            cut = _OPEN_FUNCTION.search(body) if match.group(1) is None else None
            if not functions and cut is not None:  # the text ends inside the function
                functions = [(cut, _CLOSED_PARAMETER)]
            if not functions:
                return self._error(
                    "expected <function=NAME>...</function> inside <tool_call>", content, calls
                )
            for function, parameter in functions:
                calls.append(self._call(function, parameter))
        if "</tool_call>" in content:
            return self._error("a </tool_call> tag has no <tool_call>", content, calls)
        if "<function=" in content:
            return self._error("<function=...> must be inside <tool_call> tags", content, calls)
        return ParsedResponse(content, calls)

    def _call(self, function: re.Match[str], parameter: re.Pattern[str]) -> ToolCall:
        name = function.group(1).strip()
        properties = self.properties.get(name, {})
        arguments: dict[str, Any] = {}
        for param in parameter.finditer(function.group(2)):
            key = param.group(1).strip()
            raw = param.group(2)
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            arguments[key] = convert_value(raw, properties.get(key))
        return ToolCall(name, arguments)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        blocks = []
        for call in calls:
            params = "".join(
                f"<parameter={key}>\n{_render_value(value)}\n</parameter>\n"
                for key, value in call.arguments.items()
            )
            blocks.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join([content.strip(), *blocks] if content.strip() else blocks)


PARSERS: dict[str, type[ToolCallParser]] = {p.name: p for p in (HermesParser, Qwen3CoderParser)}


def get_parser(
    name: str, schemas: Sequence[Mapping[str, Any]] = (), *, reasoning_opened: bool = False
) -> ToolCallParser:
    """The parser called ``name`` (``hermes`` or ``qwen3_coder``) for tools ``schemas``;
    ``reasoning_opened``: the chat template opens the reasoning block (module docstring).

    Raises:
        ValueError: unknown parser name.
    """
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(PARSERS)}")
    return PARSERS[name](schemas, reasoning_opened=reasoning_opened)
