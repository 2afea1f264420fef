"""``CappedOutput``: stdout and stderr of one command, each kept up to a byte cap."""

from __future__ import annotations


class CappedOutput:
    """Two byte buffers with a cap each; bytes beyond the cap are dropped and counted.

    Args:
        cap: bytes kept per stream.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.truncated = False

    def add(self, buf: bytearray, data: bytes) -> None:
        """Append ``data`` to ``buf`` (``self.stdout`` or ``self.stderr``) within the cap."""
        room = self.cap - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        buf += data

    def text(self, buf: bytearray) -> str:
        """``buf`` decoded as UTF-8, invalid bytes replaced."""
        return buf.decode("utf-8", "replace")
