"""Tool-call parsers: round trips over schema-typed arguments, and malformed text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandlot.tools.parsers import PARSERS, ToolCall, convert_value, get_parser

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "typed",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "i": {"type": "integer"},
                    "f": {"type": "number"},
                    "b": {"type": "boolean"},
                    "a": {"type": "array", "items": {"type": "integer"}},
                    "o": {"type": "object"},
                    "e": {"type": "string", "enum": ["view", "create"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "bare", "parameters": {"properties": {}}}},
]

# Text the qwen3_coder format cannot carry inside a value.
_CLOSERS = ("</parameter>", "</function>", "</tool_call>", "<parameter=", "<tool_call>")
safe_text = st.text().filter(lambda s: not any(c in s for c in _CLOSERS))
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
typed_args = st.fixed_dictionaries(
    {},
    optional={
        "s": safe_text,
        "i": st.integers(),
        "f": st.floats(allow_nan=False, allow_infinity=False),
        "b": st.booleans(),
        "a": st.lists(st.integers(), max_size=5),
        "o": st.dictionaries(safe_text, json_leaf, max_size=4),
        "e": st.sampled_from(["view", "create"]),
    },
)
content_text = st.text().filter(
    lambda s: "<tool_call>" not in s and "</tool_call>" not in s and "<function=" not in s
)


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(args=st.lists(typed_args, max_size=3), content=content_text)
def test_round_trip(name: str, args: list[dict[str, Any]], content: str) -> None:
    parser = get_parser(name, SCHEMAS)
    calls = [ToolCall("typed", a) for a in args]
    parsed = parser.parse(parser.render(calls, content))
    assert parsed.error is None
    assert parsed.calls == calls
    assert parsed.content == content.strip()


def test_hermes_reads_what_qwen_templates_write() -> None:
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "submit", "arguments": "{}"}\n</tool_call>'
    )
    parsed = get_parser("hermes").parse(text)
    assert parsed.content == "Let me look."
    assert parsed.calls == [ToolCall("bash", {"command": "ls -la"}), ToolCall("submit", {})]


def test_qwen3_coder_reads_the_template_format() -> None:
    text = (
        "I will edit.\n\n<tool_call>\n<function=typed>\n"
        "<parameter=s>\nline 1\n  line 2\n</parameter>\n"
        "<parameter=i>\n42\n</parameter>\n<parameter=a>\n[1, 2]\n</parameter>\n"
        "<parameter=b>\nTrue\n</parameter>\n<parameter=unknown>\n7\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    parsed = get_parser("qwen3_coder", SCHEMAS).parse(text)
    assert parsed.error is None and parsed.content == "I will edit."
    assert parsed.calls == [
        ToolCall(
            "typed", {"s": "line 1\n  line 2", "i": 42, "a": [1, 2], "b": True, "unknown": "7"}
        )
    ]


def test_conversion_keeps_text_that_does_not_convert() -> None:
    assert convert_value("abc", {"type": "integer"}) == "abc"
    assert convert_value("[1, 2", {"type": "array"}) == "[1, 2"
    assert convert_value("(1, 2)", {"type": "array"}) == (1, 2)
    assert convert_value("null", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) is None
    assert convert_value("null", {"type": "string"}) == "null"
    assert convert_value(" 2.5 ", {"type": "number"}) == 2.5


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("hermes", "<tool_call>\n{bad json}\n</tool_call>", "invalid JSON inside <tool_call>"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', 'needs a string "name"'),
        (
            "hermes",
            '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
            "must be a JSON object",
        ),
        ("hermes", '<tool_call>{"name": "x", "arguments": {}}', "is not closed"),
        ("qwen3_coder", "<tool_call>\nbash ls\n</tool_call>", "expected <function=NAME>"),
        ("qwen3_coder", "<tool_call>\n<function=bash>\n</function>", "is not closed"),
        ("qwen3_coder", "<function=bash>\n</function>", "must be inside <tool_call>"),
    ],
)
def test_malformed_text_is_a_format_error(name: str, text: str, reason: str) -> None:
    parsed = get_parser(name, SCHEMAS).parse(text)
    assert parsed.error is not None
    assert reason in parsed.error
    assert parsed.error.startswith("Your tool call could not be parsed")


def test_plain_text_has_no_calls() -> None:
    for name in PARSERS:
        parsed = get_parser(name).parse("  Just thinking.  ")
        assert (parsed.content, parsed.calls, parsed.error) == ("Just thinking.", [], None)


def test_unknown_parser() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("xml")
