"""Tool-call parsers: round trips over schema-typed arguments, and malformed text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tools import vllm_oracle

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

# Text the qwen3_coder format cannot carry inside a value, and the reasoning tags, which the
# reasoning split reads in the raw reply wherever they stand (as vLLM's deepseek_r1 parser).
_CLOSERS = (
    "</parameter>",
    "</function>",
    "</tool_call>",
    "<parameter=",
    "<tool_call>",
    "<think>",
    "</think>",
)
safe_text = st.text().filter(lambda s: not any(c in s for c in _CLOSERS))
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    safe_text,
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
    lambda s: (
        not any(t in s for t in ("<tool_call>", "</tool_call>", "<function=", "<think>"))
        and "</think>" not in s
    )
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
        ("hermes", '<tool_call>{"name": "x", "arguments": {}', "invalid JSON inside"),
        ("hermes", '{"name": "x"}</tool_call>', "</tool_call> tag has no <tool_call>"),
        ("qwen3_coder", "<tool_call>\nbash ls\n</tool_call>", "expected <function=NAME>"),
        ("qwen3_coder", "<tool_call>\n<function>\nls", "expected <function=NAME>"),
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


# ----------------------------------------------------------------------------- reasoning

CALL = ToolCall("bash", {"command": "ls"})


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_call_inside_the_reasoning_is_not_taken(name: str) -> None:
    """Drafted while thinking, the call is reasoning; the one after ``</think>`` is the call.
    The reasoning text is kept (``reasoning``); the agent keeps the whole reply."""
    parser = get_parser(name, SCHEMAS)
    draft = parser.render([ToolCall("bash", {"command": "rm -rf /testbed"})])
    answer = parser.render([CALL])
    parsed = parser.parse(f"<think>\nMaybe:\n{draft}\nNo.\n</think>\n\n{answer}")
    assert parsed.error is None and parsed.calls == [CALL]
    assert parsed.reasoning is not None and "rm -rf /testbed" in parsed.reasoning
    only_draft = parser.parse(f"<think>\n{draft}\n</think>\nI stop here.")
    assert (only_draft.calls, only_draft.content, only_draft.error) == ([], "I stop here.", None)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_reasoning_block_left_open_is_all_reasoning(name: str) -> None:
    """Opened by the model and never closed, or opened by the chat template (the reply then
    has only ``</think>``, or no tag at all when it never finished thinking)."""
    parser = get_parser(name, SCHEMAS)
    draft = parser.render([CALL])
    assert parser.parse(f"<think>\nthinking {draft}").calls == []
    opened = get_parser(name, SCHEMAS, reasoning_opened=True)
    assert opened.parse(f"still thinking {draft}").calls == []
    closed = opened.parse(f"thought {draft}</think>\n{draft}")
    assert closed.calls == [CALL] and closed.reasoning == f"thought {draft}"
    # Without the template opening it, text without tags is the answer.
    assert parser.parse(draft).calls == [CALL]


@given(
    value=st.text().filter(lambda s: "<think>" not in s and "</think>" not in s),
    closed=st.booleans(),
)
def test_hermes_tags_inside_a_json_string_do_not_end_the_call(value: str, closed: bool) -> None:
    """A file being written may hold ``</tool_call>`` (or ``<tool_call>``): inside a JSON
    string it is data, not markup (vLLM's non-greedy regex would cut the call there). Think
    tags are left out: the reasoning split reads the raw reply, as vLLM's does."""
    call = ToolCall("typed", {"s": value, "o": {"x": "</tool_call><tool_call>"}})
    parser = get_parser("hermes", SCHEMAS)
    text = parser.render([call], "Writing it.")
    parsed = parser.parse(text if closed else text.removesuffix("</tool_call>"))
    assert parsed.error is None and parsed.calls == [call] and parsed.content == "Writing it."


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_an_unclosed_last_call_is_taken(name: str) -> None:
    """As vLLM's hermes parser takes ``<tool_call>(.*)`` at the end: the stop token cut the
    closing tag off."""
    parser = get_parser(name, SCHEMAS)
    text = parser.render([CALL]).removesuffix("</tool_call>").rstrip()
    parsed = parser.parse(f"Let me look.\n{text}")
    assert parsed.error is None and parsed.calls == [CALL]
    assert parsed.content == "Let me look."


# ----------------------------------------------------------------------------- against vLLM

_TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
prose = st.text(alphabet=st.sampled_from('ab <>/\n{}"')).filter(
    lambda s: not any(t in s for t in _TAGS)
)
hermes_call = st.builds(
    lambda name, args: json.dumps({"name": name, "arguments": args}),
    st.sampled_from(["bash", "submit", "str_replace_editor"]),
    st.dictionaries(st.sampled_from(["command", "path", "n"]), json_leaf, max_size=3),
)
piece = st.one_of(
    prose,
    hermes_call.map(lambda c: f"<tool_call>\n{c}\n</tool_call>"),
    st.just("<think>"),
    st.just("</think>"),
)


@given(
    pieces=st.lists(piece, max_size=8),
    unclosed=st.one_of(st.none(), hermes_call, prose),
    opened=st.booleans(),
)
def test_hermes_takes_the_calls_vllm_takes(
    pieces: list[str], unclosed: str | None, opened: bool
) -> None:
    """On the same text, sandlot's hermes parser executes exactly the calls vLLM 0.24 returns
    with its ``deepseek_r1`` reasoning parser (when the reply has a think tag or the template
    opened the block) or without one (plain replies); where vLLM finds no call because the
    markup does not parse, sandlot reports a format error instead (the model is told)."""
    text = "".join(pieces) + (f"<tool_call>\n{unclosed}" if unclosed is not None else "")
    thinking = opened or "<think>" in text or "</think>" in text
    expected = vllm_oracle.calls(text, reasoning_parser=thinking)
    parsed = get_parser("hermes", reasoning_opened=opened).parse(text)
    if expected is None:
        assert parsed.error is not None
    else:
        assert parsed.error is None, parsed.error
        assert [(c.name, c.arguments) for c in parsed.calls] == expected


def test_a_qwen3_coder_call_cut_inside_its_function_keeps_its_closed_parameters() -> None:
    """The stop token cut the call inside ``<function=...>``: it is taken, as vLLM's engine
    takes it, with the parameters that were closed; a value running to the end (maybe cut
    short: ``rm -rf /testbed/bu``) is not used."""
    parser = get_parser("qwen3_coder", SCHEMAS)
    text = "<tool_call>\n<function=typed>\n<parameter=i>\n3\n</parameter>\n<parameter=s>\nrm -rf /t"
    assert parser.parse(text).calls == [ToolCall("typed", {"i": 3})]
    assert parser.parse("<tool_call>\n<function=bare>\n").calls == [ToolCall("bare", {})]


qwen_value = st.text(alphabet=st.sampled_from("abc xyz/-.{}\n"), min_size=1).map(str.strip)
qwen_call = st.builds(
    ToolCall,
    st.sampled_from(["bash", "submit", "str_replace_editor"]),
    st.dictionaries(st.sampled_from(["command", "path", "n"]), qwen_value.filter(bool), max_size=3),
)
qwen_prose = st.text(alphabet=st.sampled_from('ab \n{}"')).filter(
    lambda s: not any(t in s for t in _TAGS)
)


@given(
    pieces=st.lists(
        st.one_of(
            qwen_prose,
            qwen_call.map(lambda c: get_parser("qwen3_coder").render([c])),
            st.just("<think>"),
            st.just("</think>"),
        ),
        max_size=6,
    ),
    cut=st.one_of(st.none(), st.tuples(qwen_call, st.floats(0, 1))),
    opened=st.booleans(),
)
def test_qwen3_coder_takes_the_calls_vllm_takes(
    pieces: list[str], cut: tuple[ToolCall, float] | None, opened: bool
) -> None:
    """On the same text, sandlot's qwen3_coder parser executes exactly the calls vLLM 0.24's
    qwen3_coder parser returns after its ``deepseek_r1`` reasoning parser (or without one,
    for plain replies), including a last call cut anywhere after its ``<function=NAME>``."""
    text = "".join(pieces)
    if cut is not None:
        call, where = cut
        whole = get_parser("qwen3_coder").render([call])
        head = len(f"<tool_call>\n<function={call.name}>")
        text += whole[: head + int(where * (len(whole) - head))]
    thinking = opened or "<think>" in text or "</think>" in text
    expected = vllm_oracle.calls(text, reasoning_parser=thinking, tool_parser="qwen3_coder")
    parsed = get_parser("qwen3_coder", reasoning_opened=opened).parse(text)
    executed = [] if parsed.error else [(c.name, c.arguments) for c in parsed.calls]
    assert executed == expected, parsed.error
