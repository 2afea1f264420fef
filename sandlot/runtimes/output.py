"""``OutputBuffer``: collects a command's output under a character cap, keeping head and tail."""

from __future__ import annotations

import codecs

DEFAULT_MAX_OUTPUT_CHARS = 100_000


def truncation_note(omitted: int, head: int, tail: int) -> str:
    """The line put where the middle of an over-long output was cut."""
    return (
        f"\n[sandlot: output truncated: {omitted} characters omitted here; "
        f"showing the first {head} and the last {tail} characters]\n"
    )


class OutputBuffer:
    """Decodes a byte stream as UTF-8 (invalid bytes become U+FFFD) and keeps at most
    ``max_chars`` characters of it: the first half and the last half, so memory stays bounded
    however much a command prints.

    Args:
        max_chars: cap in characters on the text kept (the truncation note comes on top).
    """

    def __init__(self, max_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> None:
        if max_chars < 2:
            raise ValueError(f"max_chars must be at least 2, got {max_chars}")
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head_cap = max_chars // 2
        self._tail_cap = max_chars - self._head_cap
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self._total = 0

    def feed(self, data: bytes) -> None:
        """Add the next bytes of the stream."""
        self._add(self._decoder.decode(data))

    def _add(self, text: str) -> None:
        if not text:
            return
        self._total += len(text)
        room = self._head_cap - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, len(text))
            text = text[room:]
        if text:
            self._tail = (self._tail + text)[-self._tail_cap :]

    @property
    def total_chars(self) -> int:
        """Characters seen so far, kept or not."""
        return self._total

    def text(self) -> tuple[str, bool]:
        """The kept text and whether its middle was elided; flushes a dangling partial
        UTF-8 sequence as U+FFFD."""
        self._add(self._decoder.decode(b"", final=True))
        head = "".join(self._head)
        omitted = self._total - len(head) - len(self._tail)
        if omitted <= 0:
            return head + self._tail, False
        return head + truncation_note(omitted, len(head), len(self._tail)) + self._tail, True
