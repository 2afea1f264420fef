"""The members of a tar stream with the bytes of their headers, their data copied in large chunks.

The conversion into squashfs (:mod:`sandlot.images.squash`) writes most entries of a layer
unchanged. :class:`tarfile.TarFile` cannot: it hands out parsed :class:`~tarfile.TarInfo`
objects only, so each entry would be written again from them (``TarInfo.tobuf``, the PAX
header built anew) and its data copied through 10 KiB reads; that round trip was about half
the Python time of a conversion (1.2 s of 13.5k entries, 345 MB). Here :mod:`tarfile` still
parses every header (``TarInfo.fromtarfile``, its documented reader, with ustar, PAX, GNU long
names and all four sparse formats), but over a reader that keeps the bytes the header took, so
an entry that needs no change is written back as those bytes and its data copied through in
1 MiB slices; one that does is written anew (``TarInfo.tobuf``).
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from typing import Protocol

CHUNK = 1 << 20
"""Bytes read from the stream at a time."""

BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(CHUNK)
_END = bytes(2 * BLOCK)
"""The end of an archive (two zero blocks)."""


class Readable(Protocol):
    """What the stream must offer: ``read(size)``, at most ``size`` bytes, none only at its end."""

    def read(self, size: int = -1) -> bytes: ...


class TarMembers:
    """The members of the tar ``source``, read in order, once (:meth:`__iter__`).

    After a member is yielded, its data is copied with :meth:`copy_data` (as stored, through
    its padding: for an entry written back unchanged), :meth:`content` (the file's bytes,
    a sparse file's holes as zeros), or left alone (skipped when the next member is read).

    The attributes ``fileobj``, ``encoding``, ``errors``, ``pax_headers`` (the archive's
    global PAX records) and ``offset`` (where the next header starts) are those
    ``TarInfo.fromtarfile`` reads of the archive it parses; ``read`` and ``tell`` are those it
    reads of ``fileobj``.
    """

    def __init__(self, source: Readable) -> None:
        self.source = source
        self.fileobj = self
        self.encoding = tarfile.ENCODING
        self.errors = "surrogateescape"
        self.pax_headers: dict[str, str] = {}
        self.offset = 0
        self._buf = b""
        self._start = 0  # of the unread bytes in _buf
        self._pos = 0  # bytes of the stream consumed
        self._record: list[bytes] | None = None

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes of the stream (fewer only at its end)."""
        assert size >= 0
        while len(self._buf) - self._start < size:
            chunk = self.source.read(CHUNK)
            if not chunk:
                break
            self._buf = self._buf[self._start :] + chunk
            self._start = 0
        data = self._buf[self._start : self._start + size]
        self._start += len(data)
        self._pos += len(data)
        if self._record is not None:
            self._record.append(data)
        return data

    def tell(self) -> int:
        """Bytes of the stream consumed."""
        return self._pos

    def __iter__(self) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
        """Each member and the bytes of its header blocks (its PAX or GNU extended headers
        included), as :class:`tarfile.TarFile` reads them: a zero block or the stream's end
        ends the archive, as does a header that is not one after the first.

        Raises:
            tarfile.ReadError: the first header is not one, or an extended header is broken.
        """
        first = True
        while True:
            self._skip(self.offset - self._pos)  # what the previous member's data left
            self._record = []
            try:
                member = tarfile.TarInfo.fromtarfile(self)  # type: ignore[arg-type]
            except (tarfile.EOFHeaderError, tarfile.EmptyHeaderError):  # type: ignore[attr-defined]
                return
            except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as exc:  # type: ignore[attr-defined]
                if first:
                    raise tarfile.ReadError(str(exc)) from None
                return
            except tarfile.SubsequentHeaderError as exc:  # type: ignore[attr-defined]
                raise tarfile.ReadError(str(exc)) from None
            finally:
                header, self._record = b"".join(self._record), None
            first = False
            yield member, header

    def copy_data(self, write: Callable[[memoryview], object]) -> None:
        """Pass the current member's data as stored (padding included) to ``write``."""
        for piece in self._pieces(self.offset - self._pos):
            write(piece)

    def content(self, member: tarfile.TarInfo) -> Iterator[memoryview | bytes]:
        """The bytes of regular file ``member`` (the one just yielded), exactly ``member.size``
        in all: a sparse file's data with its holes as zeros.

        Raises:
            tarfile.ReadError: the stream ends first, or a sparse map is out of order.
        """
        if member.sparse is None:
            yield from self._pieces(member.size)
            return
        at = 0
        sparse: list[tuple[int, int]] = member.sparse  # type: ignore[assignment]
        for offset, length in sparse:
            if not length:
                continue  # GNU tar's markers: (size, 0) last, (0, 0) as padding
            if offset < at or offset + length > member.size:
                # Exactly member.size bytes, or the writer's reader would take data as headers.
                raise tarfile.ReadError(f"{member.name!r} has a sparse map out of order")
            yield from _zeros(offset - at)
            yield from self._pieces(length)
            at = offset + length
        yield from _zeros(member.size - at)

    def _pieces(self, size: int) -> Iterator[memoryview]:
        """The next ``size`` bytes of the stream in slices of its buffer (each valid until
        the next is asked for).

        Raises:
            tarfile.ReadError: the stream ends first.
        """
        while size > 0:
            if self._start == len(self._buf):
                self._buf, self._start = self.source.read(CHUNK), 0
                if not self._buf:
                    raise tarfile.ReadError("unexpected end of data")
            end = min(len(self._buf), self._start + size)
            piece = memoryview(self._buf)[self._start : end]
            size -= end - self._start
            self._pos += end - self._start
            self._start = end
            yield piece

    def _skip(self, size: int) -> None:
        for _ in self._pieces(size):
            pass


def padding(size: int) -> bytes:
    """The zeros that pad ``size`` bytes of data to a whole tar block."""
    return _ZEROS[: -size % BLOCK]


def end_of_archive() -> bytes:
    """The two zero blocks that end a tar."""
    return _END


def _zeros(size: int) -> Iterator[bytes]:
    while size > 0:
        yield _ZEROS[: min(size, CHUNK)]
        size -= CHUNK
