"""One OCI layer tar into a directory in kernel overlayfs format.

The OCI image spec (``image-spec/layer.md``) describes a layer as a tar of changes; overlayfs
(``Documentation/filesystems/overlayfs.rst``) describes an upper directory. This module turns
one into the other, layer by layer, so a layer shared by many images is unpacked once and any
stack of them can be mounted as ``lowerdir``s:

* ``.wh.NAME`` (a whiteout) becomes a character device 0/0 named ``NAME`` (which the kernel lets
  any user create, since Linux 5.8); ``.wh..wh..opq`` (an opaque directory) becomes the xattr
  ``user.overlay.opaque=y`` on its directory, which overlayfs mounted with ``userxattr`` in a
  user namespace reads (Linux 5.11);
* a hard link whose target is not in this layer is linked to (or copied from) the target in the
  layers below, as docker and containers/storage resolve it (the layers below are asked for
  only then, topmost first: a layer unpacked in parallel with those below it waits, at such
  a link, only for the layers down to the one that has its target);
* symlinks are created as they are and never followed: an entry below a symlink, a ``..``
  component or an absolute name is refused (the layer could otherwise write outside its
  directory);
* device nodes are skipped, as rootless podman skips them (counted in the result); FIFOs are
  kept;
* modes (with setuid/setgid/sticky bits) and modification times are kept; ownership is not:
  every file belongs to the user who pulled, and appears as root in the jail's user namespace;
* xattrs from PAX ``SCHILY.xattr.*`` records are set when this user may set them (``user.*``);
  others (``security.capability``, ``trusted.*``) are skipped and counted; ``*.overlay.*``
  ones are refused, as they would forge overlay metadata.

The uncompressed stream is hashed while it is read: a layer whose digest is not its config's
``diff_id`` is an error.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib
import os
import posixpath
import shutil
import stat
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandlot.images.errors import ImageError

OPAQUE_XATTR = "user.overlay.opaque"
"""Marks an opaque directory for overlayfs mounted with ``userxattr``."""

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
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
        xattrs_skipped: xattrs this user may not set.
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
    blob: Path, diff_id: str, dest: Path, below: Callable[[], Iterable[Path]]
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

    Raises:
        ImageError: the tar is corrupt, its digest is not ``diff_id``, or an entry would write
            outside ``dest`` (not retryable).
        OSError: the disk refused a write.
    """
    dest.mkdir(mode=0o700)
    stats = UnpackStats()
    read_end, write_end = os.pipe()
    with suppress(OSError):  # 1 MiB, the most an unprivileged user gets: fewer switches
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _CHUNK)
    feeder = _Feeder(blob, write_end)
    feeder.start()
    writer = _LayerWriter(dest, below, stats, blob.name)
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
    except (tarfile.TarError, EOFError, ValueError) as exc:
        feeder.check()  # a corrupt blob explains a truncated tar: say that
        raise ImageError(f"layer {blob.name} is not a valid tar: {exc}") from exc
    feeder.check()
    writer.finish()
    found = "sha256:" + feeder.digest.hexdigest()
    if found != diff_id:
        raise ImageError(
            f"layer {blob.name} unpacks to {found}, not the diff_id {diff_id} its image config "
            f"names: the blob is corrupt or the image is malformed; nothing was cached"
        )
    return stats


class _LayerWriter:
    def __init__(
        self, dest: Path, below: Callable[[], Iterable[Path]], stats: UnpackStats, name: str
    ) -> None:
        self.dest = dest
        self.below = below
        self.stats = stats
        self.name = name
        self.safe_dirs: set[str] = {""}
        self.dir_attrs: dict[str, tuple[int, float]] = {}

    def _refuse(self, entry: str, why: str) -> ImageError:
        return ImageError(f"layer {self.name}: entry {entry!r} {why}; refused")

    def _relative(self, name: str) -> str:
        rel = posixpath.normpath(name.lstrip("/")) if name.strip("/.") else ""
        if rel == "." or not rel:
            return ""
        if rel == ".." or rel.startswith("../"):
            raise self._refuse(name, "leaves the layer")
        return rel

    def _parent(self, rel: str, entry: str) -> str:
        """Make the parent directories of ``rel`` (no symlink on the way); return it."""
        parent = posixpath.dirname(rel)
        if parent in self.safe_dirs:
            return parent
        walked = ""
        for part in parent.split("/"):
            walked = f"{walked}/{part}" if walked else part
            if walked in self.safe_dirs:
                continue
            path = os.path.join(self.dest, walked)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                os.mkdir(path, 0o700)
                self.dir_attrs.setdefault(walked, (0o755, 0.0))
            else:
                if not stat.S_ISDIR(st.st_mode):
                    raise self._refuse(entry, f"lies below {walked!r}, which is not a directory")
            self.safe_dirs.add(walked)
        return parent

    def _clear(self, rel: str, path: str, keep_dir: bool) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            shutil.rmtree(path)
            self.safe_dirs = {d for d in self.safe_dirs if d != rel and not d.startswith(rel + "/")}
        else:
            os.unlink(path)

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.stats.entries += 1
        rel = self._relative(member.name)
        if not rel:
            return  # the layer's root: the mount point's attributes come from the lowest layer
        base = posixpath.basename(rel)
        parent = self._parent(rel, member.name)
        if base == _OPAQUE:
            os.setxattr(os.path.join(self.dest, parent), OPAQUE_XATTR, b"y")
            return
        if base.startswith(_WHITEOUT):
            path = os.path.join(self.dest, parent, base[len(_WHITEOUT) :])
            self._clear(posixpath.join(parent, base[len(_WHITEOUT) :]), path, keep_dir=False)
            os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))
            return
        path = os.path.join(self.dest, rel)
        if member.isreg():  # most entries: no lstat first, _file clears what is in the way
            self._file(tar, member, rel, path)
            self._xattrs(member, path)
            return
        if member.isdir():
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:  # a directory stays (and merges); anything else goes
                self._clear(rel, path, keep_dir=True)
                if not os.path.isdir(path):
                    os.mkdir(path, 0o700)
            self.safe_dirs.add(rel)
            self.dir_attrs[rel] = (member.mode, float(member.mtime))
            self._xattrs(member, path)
            return
        if member.issym():
            try:
                os.symlink(member.linkname, path)
            except FileExistsError:
                self._clear(rel, path, keep_dir=False)
                os.symlink(member.linkname, path)
            self._xattrs(member, path)
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
            return
        self._clear(rel, path, keep_dir=False)
        if member.islnk():
            self._hardlink(member, path)
        elif member.isfifo():
            os.mkfifo(path, 0o600)
            os.chmod(path, member.mode & 0o7777)
        elif member.ischr() or member.isblk():
            self.stats.devices_skipped += 1
            return
        else:
            raise self._refuse(
                member.name, f"has tar type {member.type!r}, which layers cannot hold"
            )
        self._xattrs(member, path)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:  # an earlier entry of this layer had the name: replace it
            self._clear(rel, path, keep_dir=False)
            fd = os.open(path, flags, 0o600)
        try:
            source = tar.extractfile(member)
            assert source is not None
            while chunk := source.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchmod(fd, member.mode & 0o7777)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.stats.bytes += member.size

    def _hardlink(self, member: tarfile.TarInfo, path: str) -> None:
        target = self._relative(member.linkname)
        for layer in self._link_sources():
            source = os.path.join(layer, target)
            if os.path.lexists(source) and not _is_whiteout(source):
                break
        else:
            raise self._refuse(
                member.name, f"is a hard link to {member.linkname!r}, which no layer has"
            )
        if os.path.realpath(os.path.dirname(source)) != os.path.normpath(
            os.path.join(os.path.realpath(layer), os.path.dirname(target))
        ):
            raise self._refuse(member.name, "is a hard link through a symlink")
        try:
            os.link(source, path, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            shutil.copy2(source, path, follow_symlinks=False)

    def _link_sources(self) -> Iterator[Path]:
        """This layer, then the layers below (asked for only when this one lacks the target)."""
        yield self.dest
        yield from self.below()

    def _xattrs(self, member: tarfile.TarInfo, path: str) -> None:
        for key, value in member.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr.") :]
            if ".overlay." in name:
                raise self._refuse(member.name, f"carries the overlayfs xattr {name!r}")
            try:
                os.setxattr(
                    path, name, value.encode("utf-8", "surrogateescape"), follow_symlinks=False
                )
            except OSError:
                self.stats.xattrs_skipped += 1

    def finish(self) -> None:
        """Directory modes and times last: a read-only directory must first be filled."""
        for rel in sorted(self.dir_attrs, key=lambda r: r.count("/"), reverse=True):
            mode, mtime = self.dir_attrs[rel]
            path = os.path.join(self.dest, rel)
            os.chmod(path, mode & 0o7777)
            if mtime:
                os.utime(path, (mtime, mtime))


def _is_whiteout(path: str) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
