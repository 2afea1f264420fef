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


def calls(text: str, *, reasoning_parser: bool) -> list[tuple[str, Any]] | None:
    """What vLLM's server would call for ``text``: with the reasoning parser on, only the
    content's calls; without it, the whole text's."""
    if reasoning_parser:
        _, content = reasoning_and_content(text)
        return hermes_calls(content)
    return hermes_calls(text)
