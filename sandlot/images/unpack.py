"""One OCI layer tar into a directory in kernel overlayfs format.

The OCI image spec (``image-spec/layer.md``) describes a layer as a tar of changes; overlayfs
(``Documentation/filesystems/overlayfs.rst``) describes an upper directory. This module turns
one into the other, layer by layer, so a layer shared by many images is unpacked once and any
stack of them can be mounted as ``lowerdir``s:

* ``.wh.NAME`` (a whiteout) becomes a character device 0/0 named ``NAME`` (which the kernel lets
  any user create, since Linux 5.8); ``.wh..wh..opq`` (an opaque directory) becomes the xattr
  ``user.overlay.opaque=y`` on its directory, which overlayfs mounted with ``userxattr`` in a
  user namespace reads (Linux 5.11);
* a hard link whose target is not in this layer is copied from the target in the layers
  below, as docker and containers/storage resolve it (the layers below are asked for only
  then, topmost first: a layer unpacked in parallel with those below it waits, at such a link,
  only for the layers down to the one that has its target); a hard link may point only at a
  regular file;
* symlinks are created as they are and never followed: every entry is created relative to a
  directory descriptor walked to without following a link (:mod:`sandlot.images.layer_writer`),
  so an entry below a symlink, a ``..`` component or an absolute name is refused or resolved
  inside the layer, and modes and times go through descriptors, never a path;
* device nodes are skipped, as rootless podman skips them (counted in the result); FIFOs are
  kept;
* modes (with setuid/setgid/sticky bits) and modification times are kept; ownership is not:
  every file belongs to the user who pulled, and appears as root in the jail's user namespace;
* xattrs from PAX ``SCHILY.xattr.*`` records are kept when they are ``user.*`` (on files and
  directories); others (``security.capability``, ``trusted.*``, ``system.*``) are skipped and
  counted, also when root pulls; ``*.overlay.*`` ones are refused, as they would forge overlay
  metadata;
* what a layer writes is capped (:mod:`sandlot.images.unpack_caps`): a multiple of its
  compressed size, and a total per image.

The uncompressed stream is hashed while it is read: a layer whose digest is not its config's
``diff_id`` is an error. A layer that fails leaves nothing of itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandlot.images.errors import ImageError
from sandlot.images.layer_writer import OPAQUE_XATTR, LayerWriter
from sandlot.images.store import remove_tree
from sandlot.images.unpack_caps import Budget, charger

__all__ = ["OPAQUE_XATTR", "UnpackStats", "unpack_layer"]

_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass
class UnpackStats:
    """What one layer held.

    Attributes:
        entries: tar entries processed.
        bytes: bytes of regular file content written.
        devices_skipped: device nodes left out (rootless).
        xattrs_skipped: xattrs not kept (not ``user.*``, or refused by the filesystem).
    """

    entries: int = 0
    bytes: int = 0
    devices_skipped: int = 0
    xattrs_skipped: int = 0


class _Feeder(threading.Thread):
    """Decompresses and hashes the blob into a pipe, in a thread of its own: zlib, zstd,
    sha256 and ``write(2)`` release the GIL, so this runs on the other core while the reader
    parses the tar and creates its files (one thread doing both was the pull's bottleneck)."""

    def __init__(self, blob: Path, pipe: int) -> None:
        super().__init__(name=f"sandlot-unpack-{blob.name[:12]}", daemon=True)
        self.blob = blob
        self.pipe = pipe
        self.digest = hashlib.sha256()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open(self.blob, "rb") as raw:
                for chunk in _decompressed(raw, self.blob):
                    self.digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(self.pipe, view) :]
        except BrokenPipeError:
            pass  # the reader stopped early: the layer was refused, its error is raised there
        except BaseException as exc:  # handed to the reader's thread by check()
            self.error = exc
        finally:
            os.close(self.pipe)

    def check(self) -> None:
        """Raise what stopped the thread; a corrupt blob as :class:`ImageError`."""
        if self.error is None:
            return
        if isinstance(self.error, (ImageError, OSError)):
            raise self.error
        raise ImageError(
            f"layer {self.blob.name} is not a valid compressed tar: {self.error}"
        ) from self.error


def _decompressed(raw: IO[bytes], blob: Path) -> Iterator[bytes]:
    """The uncompressed bytes of ``raw`` in chunks (gzip, possibly of several members; zstd;
    or a plain tar), read 1 MiB at a time so that each call into the codec is a long one."""
    magic = raw.read(4)
    raw.seek(0)
    if magic.startswith(_GZIP_MAGIC):
        yield from _gunzipped(raw)
    elif magic == _ZSTD_MAGIC:
        try:
            zstandard = importlib.import_module("zstandard")
        except ImportError:
            raise ImageError(
                f"layer {blob.name} is zstd-compressed, which needs the zstandard module: "
                f"pip install zstandard"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        while chunk := reader.read(_CHUNK):
            yield chunk
    else:  # an uncompressed tar
        while chunk := raw.read(_CHUNK):
            yield chunk


def _gunzipped(raw: IO[bytes]) -> Iterator[bytes]:
    """RFC 1952 members one after another, as ``gzip -d`` reads them (zero padding after the
    last one is ignored, anything else is an error)."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    while data := raw.read(_CHUNK):
        while data:
            yield inflate.decompress(data)
            if not inflate.eof:
                break
            data = inflate.unused_data
            if not data.strip(b"\0"):
                break  # padding (what follows it is checked by the next read)
            if not data.startswith(_GZIP_MAGIC):
                raise zlib.error("bytes after the gzip stream that are not a gzip member")
            inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    if not inflate.eof:
        raise EOFError("the gzip stream ends before its end marker")


def unpack_layer(
    blob: Path,
    diff_id: str,
    dest: Path,
    below: Callable[[], Iterable[Path]],
    *,
    declared_size: int | None = None,
    image_budget: Budget | None = None,
) -> UnpackStats:
    """Unpack layer ``blob`` into the new directory ``dest``.

    Args:
        blob: the layer as stored (gzip, zstd or plain tar; told apart by magic bytes).
        diff_id: ``sha256:<hex>`` of the uncompressed tar, from the image config.
        dest: a directory that does not exist yet (the caller renames it into place).
        below: returns the unpacked layers under this one, topmost first; called only when
            a hard link's target is not in this layer, and iterated until the target is found
            (an iterator that waits for each layer to be unpacked before yielding it waits
            for no more layers than the link needs).
        declared_size: bytes of the blob as its manifest declares (default: the blob's size
            on disk, which skopeo checked against it); the layer may unpack to a multiple of
            it (:func:`sandlot.images.unpack_caps.layer_budget`).
        image_budget: the cap of the whole image, shared by its layers (default: none).

    Raises:
        ImageError: the tar is corrupt, its digest is not ``diff_id``, an entry would write
            outside ``dest`` or is otherwise refused, or it unpacks to more than a cap allows
            (not retryable). ``dest`` is removed.
        OSError: the disk refused a write (``dest`` is removed).
    """
    size = blob.stat().st_size if declared_size is None else declared_size
    charge = charger(blob.name, size, image_budget)
    dest.mkdir(mode=0o700)
    try:
        return _unpack(blob, diff_id, dest, below, charge)
    except BaseException:
        remove_tree(dest)
        raise


def _unpack(
    blob: Path,
    diff_id: str,
    dest: Path,
    below: Callable[[], Iterable[Path]],
    charge: Callable[[int], None],
) -> UnpackStats:
    stats = UnpackStats()
    read_end, write_end = os.pipe()
    with suppress(OSError):  # 1 MiB, the most an unprivileged user gets: fewer switches
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _CHUNK)
    feeder = _Feeder(blob, write_end)
    feeder.start()
    writer = LayerWriter(dest, below, stats, blob.name, charge)
    try:
        with os.fdopen(read_end, "rb", buffering=_CHUNK) as reader:
            try:
                with tarfile.open(fileobj=reader, mode="r|", errorlevel=2) as tar:
                    for member in tar:
                        writer.add(tar, member)
                while reader.read(_CHUNK):  # trailing bytes are part of the diff_id too
                    pass
            finally:
                reader.close()  # before join: a feeder blocked on the full pipe then stops
                feeder.join()
        feeder.check()
        writer.finish()
    except (tarfile.TarError, EOFError, ValueError) as exc:
        feeder.check()  # a corrupt blob explains a truncated tar: say that
        raise ImageError(f"layer {blob.name} is not a valid tar: {exc}") from exc
    finally:
        writer.close()
    found = "sha256:" + feeder.digest.hexdigest()
    if found != diff_id:
        raise ImageError(
            f"layer {blob.name} unpacks to {found}, not the diff_id {diff_id} its image config "
            f"names: the blob is corrupt or the image is malformed; nothing was cached"
        )
    return stats
