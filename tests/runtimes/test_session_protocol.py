"""The marker protocol: the scanner alone, then end to end in a live local session.

The property tests print arbitrary bytes (NUL, 0x1f, invalid UTF-8, fake markers, no trailing
newline) and exit with arbitrary codes; the session must return exactly those bytes (decoded)
and that code.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import anyio
import anyio.from_thread
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from runtime_helpers import local_isolation

import sandlot
from sandlot.runtimes import BashSession, SessionConfig
from sandlot.runtimes.protocol import Marker, MarkerScanner, command_script, new_nonce

NONCE = "0123456789abcdef"


def _scan(data: bytes, cuts: list[int]) -> tuple[bytes, list[Marker]]:
    scanner = MarkerScanner(NONCE)
    out, markers = bytearray(), []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        for item in scanner.feed(data[a:b]):
            if isinstance(item, Marker):
                markers.append(item)
            else:
                out += item
    out += scanner.flush()
    return bytes(out), markers


@given(
    before=st.binary(max_size=300),
    after=st.binary(max_size=300),
    status=st.integers(0, 255),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_scanner_finds_the_marker_however_the_stream_is_cut(
    before: bytes, after: bytes, status: int, cuts: list[int]
) -> None:
    marker = f"\x1f{NONCE}:E:{status}\x1f".encode()
    out, markers = _scan(before + marker + after, cuts)
    assert markers == [Marker("E", (status,))]
    assert out == before + after


@given(st.binary(max_size=500), st.lists(st.integers(0, 10_000), max_size=8))
def test_scanner_passes_other_bytes_through(data: bytes, cuts: list[int]) -> None:
    out, markers = _scan(data, cuts)
    assert (out, markers) == (data, [])


def test_malformed_and_foreign_markers_are_output() -> None:
    fakes = [
        f"\x1f{NONCE}:E:x\x1f",  # not a number
        f"\x1f{NONCE}:Q:1\x1f",  # unknown kind
        "\x1ffedcba9876543210:E:0\x1f",  # another nonce
        f"\x1f{NONCE}:E:" + "1" * 100,  # never terminated
    ]
    for fake in fakes:
        assert _scan(fake.encode(), []) == (fake.encode(), [])


def test_command_with_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        command_script("echo a\0b", new_nonce())


@pytest.fixture(scope="module")
def live_session() -> Iterator[tuple[anyio.from_thread.BlockingPortal, BashSession]]:
    """One local session shared by every example (a hypothesis test is synchronous)."""
    with anyio.from_thread.start_blocking_portal() as portal:
        sandbox = sandlot.open("local", isolation=local_isolation())
        portal.call(sandbox.start)
        try:
            session = portal.call(
                functools.partial(sandbox.shell, "protocol", config=SessionConfig())
            )
            yield portal, session
        finally:
            portal.call(sandbox.close)


def _printf_octal(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)


SPECIAL = st.sampled_from(
    [b"\x1f", b"\x00", b"\xff\xfe", b"\n", b"\x1fsandlot:E:0\x1f", b"EOF", b"SANDLOT_", b"$?"]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    chunks=st.lists(st.one_of(st.binary(max_size=200), SPECIAL), max_size=6),
    status=st.integers(0, 255),
)
def test_any_output_and_exit_code_round_trip(
    live_session: tuple[anyio.from_thread.BlockingPortal, BashSession],
    chunks: list[bytes],
    status: int,
) -> None:
    portal, session = live_session
    data = b"".join(chunks)
    command = f"printf '{_printf_octal(data)}'\n(exit {status})"
    obs = portal.call(session.run, command)
    assert obs.exit_code == status
    assert obs.output == data.decode("utf-8", "replace")
    assert not obs.shell_restarted


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=200
    )
)
def test_any_command_text_reaches_bash_verbatim(
    live_session: tuple[anyio.from_thread.BlockingPortal, BashSession], text: str
) -> None:
    assume("SANDLOT_TEST_END" not in text)
    portal, session = live_session
    # The command holds the text in its own quoted here-document: bash must see it as is.
    obs = portal.call(session.run, f"cat <<'SANDLOT_TEST_END'\n{text}\nSANDLOT_TEST_END")
    assert (obs.output, obs.exit_code) == (f"{text}\n", 0)
