"""vLLM 0.24.0's decisions on a reply's reasoning and hermes tool calls, ported as a test oracle
(vLLM itself needs torch and a GPU build to import). Read from the wheel
``vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl``; the rules, not the code, are copied:

* reasoning, ``vllm/reasoning/basic_parsers.py`` lines 157-181
  (``BaseThinkingReasoningParser.extract_reasoning``, the ``deepseek_r1`` parser): keep what
  follows the first ``<think>`` (everything when there is none); no ``</think>`` → all of it is
  reasoning and there is no content; else reasoning is what precedes the first ``</think>``
  and content what follows it (``None`` when empty). The tool parser sees only the content.
* hermes calls, ``vllm/tool_parsers/hermes_tool_parser.py`` lines 38-40 (``tool_call_regex``)
  and 70-120 (``extract_tool_calls``): no ``<tool_call>`` → no calls; else every match of
  "a closed call, or ``<tool_call>`` to the end of the text" is JSON-decoded and its ``name``
  and ``arguments`` taken; any failure → no calls at all (the text stays content).
* qwen3_coder calls (``Qwen3EngineToolParser``) on the content a reasoning parser left, so
  parsing starts in the ``CONTENT`` state (``vllm/parser/engine/parser_engine.py`` lines
  530-553, ``extract_tool_calls_from_content``): the state machine of ``vllm/parser/qwen3.py``
  lines 100-175 over its terminals (lines 84-94); a terminal with no transition is text of
  the state it is in; at the end an open call is closed (``streaming_parser_engine.py``
  lines 198-211); each call's argument text goes through ``_qwen3_arg_converter`` (lines
  53-72: ``<parameter=K>V`` closed by ``</parameter>`` or followed by another parameter,
  ``V`` stripped) and is kept when it has a name (``parser_engine.py`` lines 992-1016; no
  tools in the request: every name is valid and values stay strings). Only what sandlot's
  tests generate is ported: prose without ``<``, and tool names without ``>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def reasoning_and_content(text: str) -> tuple[str, str | None]:
    """vLLM's ``(reasoning, content)`` of ``text`` with the ``deepseek_r1`` reasoning parser."""
    before, start, after = text.partition("<think>")
    rest = after if start else before
    if "</think>" not in rest:
        return rest, None
    reasoning, _, content = rest.partition("</think>")
    return reasoning, content or None


def hermes_calls(content: str | None) -> list[tuple[str, Any]] | None:
    """vLLM's hermes calls in ``content`` as ``(name, arguments)``; ``None`` when it fails."""
    if content is None or "<tool_call>" not in content:
        return []
    try:
        decoded = [json.loads(closed or open_) for closed, open_ in _CALL.findall(content)]
        return [(call["name"], call["arguments"]) for call in decoded]
    except (ValueError, KeyError, TypeError):
        return None


def calls(
    text: str, *, reasoning_parser: bool, tool_parser: str = "hermes"
) -> list[tuple[str, Any]] | None:
    """What vLLM's server would call for ``text``: with the reasoning parser on, only the
    content's calls; without it, the whole text's."""
    content = reasoning_and_content(text)[1] if reasoning_parser else text
    return hermes_calls(content) if tool_parser == "hermes" else qwen3_coder_calls(content)


_TERMINAL = re.compile(
    r"<think>|</think>|<tool_call>|</tool_call>|<function=|</function>|<parameter=|</parameter>|>"
)
# (state, terminal) -> (next state, whether a call starts); qwen3.py lines 100-175, CONTENT on.
_TRANSITIONS = {
    ("content", "</think>"): ("content", False),
    ("content", "<tool_call>"): ("preamble", True),
    ("content", "<function="): ("name", True),
    ("preamble", "</tool_call>"): ("content", False),
    ("preamble", "<function="): ("name", False),
    ("name", ">"): ("args", False),
    ("name", "</function>"): ("between", False),
    ("args", "</function>"): ("between", False),
    ("between", "</tool_call>"): ("content", False),
    ("between", "<tool_call>"): ("preamble", True),
    ("between", "<function="): ("name", True),
}
_PARAM = re.compile(
    r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))",
    re.DOTALL,
)


def qwen3_coder_calls(content: str | None) -> list[tuple[str, Any]]:
    """vLLM's qwen3_coder calls in ``content`` as ``(name, arguments)``."""
    if content is None:
        return []
    state = "content"
    slots: list[list[str]] = []  # [name, argument text] per call
    at = 0
    for match in [*_TERMINAL.finditer(content), None]:
        text = content[at : match.start() if match else len(content)]
        if state == "name":
            slots[-1][0] += text
        elif state == "args":
            slots[-1][1] += text
        if match is None:
            break
        at = match.end()
        terminal = match.group()
        step = _TRANSITIONS.get((state, terminal))
        if step is None:  # no transition: the terminal is text of this state
            if state == "name":
                slots[-1][0] += terminal
            elif state == "args":
                slots[-1][1] += terminal  # the parameter tags are argument text
            continue
        state, starts = step
        if starts:
            slots.append(["", ""])
    calls = []
    for name, arguments in slots:
        if name.strip():
            params = {k: v.strip() for k, v in _PARAM.findall(arguments)}
            calls.append((name.strip(), params))
    return calls
