"""``OutputBuffer``: character cap with head and tail, incremental UTF-8 decoding."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from sandlot.runtimes.output import OutputBuffer


def test_short_output_is_kept_whole() -> None:
    buf = OutputBuffer(10)
    buf.feed(b"hello")
    assert buf.text() == ("hello", False)


def test_long_output_keeps_head_and_tail_with_a_note() -> None:
    buf = OutputBuffer(10)
    for chunk in (b"abcdefgh", b"ijklmnop", b"qrst"):
        buf.feed(chunk)
    text, truncated = buf.text()
    assert truncated
    assert text.startswith("abcde\n[sandlot: output truncated: 10 characters omitted")
    assert text.endswith("]\npqrst")


def test_multibyte_characters_split_across_chunks() -> None:
    data = "é€😀".encode()
    buf = OutputBuffer(100)
    for i in range(len(data)):
        buf.feed(data[i : i + 1])
    assert buf.text() == ("é€😀", False)


def test_dangling_partial_sequence_becomes_replacement_character() -> None:
    buf = OutputBuffer(100)
    buf.feed(b"ok\xe2\x82")
    assert buf.text() == ("ok\ufffd", False)


@given(st.text(max_size=300), st.integers(2, 50), st.lists(st.integers(0, 1000), max_size=5))
def test_cap_holds_for_any_text_and_chunking(text: str, cap: int, cuts: list[int]) -> None:
    data = text.encode()
    buf = OutputBuffer(cap)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        buf.feed(data[a:b])
    out, truncated = buf.text()
    assert truncated == (len(text) > cap)
    if truncated:
        head, tail = cap // 2, cap - cap // 2
        assert out.startswith(text[:head]) and out.endswith(text[len(text) - tail :])
    else:
        assert out == text
