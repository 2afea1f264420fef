"""A command's output kept up to a byte cap per stream; what comes beyond is counted and dropped.

The one implementation for every backend that collects an exec's output in this process
(``local``, ``docker``, ``modal``). The stream is still read to its end, so the command never
blocks on a full pipe, and memory stays bounded however much it prints. (A shell session's
output, capped in characters with head and tail kept and a truncation note, is
:class:`sandlot.runtimes.output.OutputBuffer`.)
"""

from __future__ import annotations


class CappedBuffer:
    """The first ``cap`` bytes of one stream (all of them when ``cap`` is ``None``).

    Args:
        cap: bytes kept; ``None`` for no cap.

    Attributes:
        data: the bytes kept.
        dropped: bytes fed beyond the cap and discarded.
    """

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append ``chunk`` within the cap; count the rest in ``dropped``."""
        if self.cap is None:
            self.data += chunk
            return
        room = max(self.cap - len(self.data), 0)
        self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    @property
    def truncated(self) -> bool:
        """``True`` once any byte was dropped."""
        return self.dropped > 0

    def text(self) -> str:
        """The bytes kept, decoded as UTF-8 with invalid bytes replaced."""
        return self.data.decode("utf-8", "replace")

    def __bytes__(self) -> bytes:
        return bytes(self.data)


class CappedOutput:
    """stdout and stderr of one command, each a :class:`CappedBuffer` of ``cap`` bytes.

    Args:
        cap: bytes kept per stream.
    """

    def __init__(self, cap: int) -> None:
        self.stdout = CappedBuffer(cap)
        self.stderr = CappedBuffer(cap)

    @property
    def truncated(self) -> bool:
        """``True`` when either stream was longer than the cap."""
        return self.stdout.truncated or self.stderr.truncated


def with_note(data: bytes, dropped: int, stream: str) -> str:
    """``data`` decoded as UTF-8 (invalid bytes replaced), followed, when ``dropped`` bytes were
    discarded, by the one truncation note every backend gives: ``[sandlot: stdout truncated:
    kept the first N bytes, discarded the remaining M bytes]`` on a line of its own."""
    text = data.decode("utf-8", "replace")
    if dropped:
        text += (
            f"\n[sandlot: {stream} truncated: kept the first {len(data)} bytes, "
            f"discarded the remaining {dropped} bytes]\n"
        )
    return text


def clip_tail(text: str | bytes, *, lines: int | None = None, chars: int = 2000) -> str:
    """The end of ``text`` (bytes decoded as UTF-8, invalid bytes replaced) for an error
    message: stripped, its last ``lines`` lines when given, then at most its last ``chars``
    characters. The one clipping of command output in :mod:`sandlot.sandboxes`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    if lines is not None:
        text = "\n".join(text.splitlines()[-lines:])
    return text[-chars:]
