"""The uncompressed tar of one layer blob, read while another thread decompresses and hashes it.

Both layer stores read a layer this way (:mod:`sandlot.images.unpack` creates its files,
:mod:`sandlot.images.squash` rewrites it for ``tar2sqfs``). A thread of its own decompresses
the blob (gzip of one or more members, zstd, or a plain tar; told apart by magic bytes) and
hashes the result (the ``diff_id``) into a pipe: zlib, ISA-L, zstd, sha256 and ``write(2)``
release the GIL, so it runs on another core while the reader parses the tar (one thread doing
both was the pull's bottleneck). gzip goes through ISA-L's inflate when ``isal`` is installed
(2.4x zlib's on a 128 MB layer), else zlib.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from sandlot.images.errors import ImageError

CHUNK = 1 << 20
"""Bytes read, decompressed and written at a time (each call into the codec a long one; the
pipe's size, the most an unprivileged user may set)."""

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class LayerStream:
    """The uncompressed bytes of layer ``blob`` as a read-only file (``read`` only: what
    :mod:`tarfile`'s stream mode needs). Use as a context manager; :meth:`digest` after the
    tar's end, :meth:`check` when the reader failed (a corrupt blob explains a truncated tar).
    """

    def __init__(self, blob: Path) -> None:
        self.blob = blob
        read_end, write_end = os.pipe()
        with suppress(OSError):  # 1 MiB: fewer switches between the threads
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK)
        self._reader = os.fdopen(read_end, "rb", buffering=CHUNK)
        self._feeder = _Feeder(blob, write_end)

    def __enter__(self) -> LayerStream:
        self._feeder.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (fewer only at the end)."""
        return self._reader.read(size)

    def close(self) -> None:
        """Stop reading (the feeder, if still writing, stops on a broken pipe) and wait for
        the feeder. Idempotent."""
        self._reader.close()  # before join: a feeder blocked on the full pipe then stops
        if self._feeder.ident is not None:  # started
            self._feeder.join()

    def check(self) -> None:
        """Close, then raise what stopped the feeder, if anything: a corrupt or truncated blob
        as :class:`ImageError`, a read error as :class:`OSError`."""
        self.close()
        error = self._feeder.error
        if error is None:
            return
        if isinstance(error, (ImageError, OSError)):
            raise error
        raise ImageError(
            f"layer {self.blob.name} is not a valid compressed tar: {error}"
        ) from error

    def digest(self) -> str:
        """``sha256:<hex>`` of the whole uncompressed stream, the bytes after the tar's end
        included (the ``diff_id`` covers them: they are read here); closes the stream.

        Raises:
            ImageError: the blob is corrupt.
            OSError: it could not be read.
        """
        while self._reader.read(CHUNK):
            pass
        self.check()
        return "sha256:" + self._feeder.digest.hexdigest()


class _Feeder(threading.Thread):
    def __init__(self, blob: Path, pipe: int) -> None:
        super().__init__(name=f"sandlot-layer-{blob.name[:12]}", daemon=True)
        self.blob = blob
        self.pipe = pipe
        self.digest = hashlib.sha256()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open(self.blob, "rb") as raw:
                for chunk in decompressed(raw, self.blob.name):
                    self.digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(self.pipe, view) :]
        except BrokenPipeError:
            pass  # the reader stopped early: its own error is raised there
        except BaseException as exc:  # raised in the reader's thread by check()
            self.error = exc
        finally:
            os.close(self.pipe)


def decompressed(raw: IO[bytes], blob: str) -> Iterator[bytes]:
    """The uncompressed bytes of ``raw`` (the blob named ``blob``, in errors) in chunks.

    Raises:
        ImageError: a zstd blob without the ``zstandard`` module.
        zlib.error, EOFError: a corrupt or truncated gzip stream.
    """
    magic = raw.read(4)
    raw.seek(0)
    if magic.startswith(_GZIP_MAGIC):
        yield from _gunzipped(raw)
    elif magic == _ZSTD_MAGIC:
        try:
            zstandard = importlib.import_module("zstandard")
        except ImportError:
            raise ImageError(
                f"layer {blob} is zstd-compressed, which needs the zstandard module: "
                f"pip install zstandard"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        while chunk := reader.read(CHUNK):
            yield chunk
    else:  # an uncompressed tar
        while chunk := raw.read(CHUNK):
            yield chunk


def _inflater() -> Any:
    """A gzip member decompressor: ISA-L's when installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    return isal_zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)


def _gunzipped(raw: IO[bytes]) -> Iterator[bytes]:
    """RFC 1952 members one after another, as ``gzip -d`` reads them (zero padding after the
    last one is ignored, anything else is an error)."""
    inflate = _inflater()
    while data := raw.read(CHUNK):
        while data:
            yield inflate.decompress(data)
            if not inflate.eof:
                break
            data = inflate.unused_data
            if not data.strip(b"\0"):
                break  # padding (what follows it is checked by the next read)
            if not data.startswith(_GZIP_MAGIC):
                raise zlib.error("bytes after the gzip stream that are not a gzip member")
            inflate = _inflater()
    if not inflate.eof:
        raise EOFError("the gzip stream ends before its end marker")
