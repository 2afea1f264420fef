"""The entries of one layer tar created in a directory, safe by construction.

A layer is input from whoever published the image. Every entry is created relative to a
directory file descriptor, and every descriptor is opened one component at a time with
``O_NOFOLLOW | O_DIRECTORY`` from the layer's own directory: a symlink or a file where a
directory is expected stops the walk (the entry is refused), so no entry, however the tar
orders its names, creates, removes or changes anything but this layer's own files. Modes and
times are applied through descriptors (``fchmod``, ``futimens``), or ``AT_SYMLINK_NOFOLLOW``
for a symlink's time, never through a path. Directory modes and times are applied last (a
read-only directory must first be filled), each directory re-opened by the same walk: one
that a later entry replaced (by a symlink, a file, a hard link) has nothing applied, its
recorded attributes dropped with it.

A hard link may point at a regular file: of this layer (linked), or, as docker and
containers/storage resolve links across layers, of a layer below (copied with its mode, times
and ``user.*`` xattrs: never linked, so nothing this layer does can change a file another
image shares). Only ``user.*`` xattrs are set, on regular files and directories; ``*.overlay.*``
ones are refused (they would forge overlay metadata). What is written is charged to the
layer's and the image's :class:`~sandlot.images.unpack_caps.Budget` before it is written.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
import sys
import tarfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from sandlot.images.errors import ImageError
from sandlot.images.unpack_caps import ENTRY_COST

OPAQUE_XATTR = "user.overlay.opaque"
"""Marks an opaque directory for overlayfs mounted with ``userxattr``."""

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_DIRECTORY = (errno.ELOOP, errno.ENOTDIR)  # a component is a symlink, or a file
MAX_DEPTH = 256
"""Directories an entry may lie under (real trees, ``node_modules`` included, stay under 64;
deeper ones only exhaust descriptors and recursion on the way)."""
_OPEN_DIRS = 256
"""Directory descriptors kept open between entries (most entries share their parent)."""


class Stats(Protocol):
    """The counters of :class:`sandlot.images.unpack.UnpackStats` this module updates."""

    entries: int
    bytes: int
    devices_skipped: int
    xattrs_skipped: int


class LayerWriter:
    """Creates the entries of one layer under ``dest`` (an empty directory); :meth:`finish`
    applies the directories' attributes, :meth:`close` releases the descriptors (always)."""

    def __init__(
        self,
        dest: Path,
        below: Callable[[], Iterable[Path]],
        stats: Stats,
        name: str,
        charge: Callable[[int], None],
    ) -> None:
        """``below``: the layers under this one, topmost first (asked for only at a hard
        link whose target this layer lacks); ``name``: the layer, in errors; ``charge``:
        counts bytes about to be written (raises past the caps)."""
        self.below = below
        self.stats = stats
        self.name = name
        self.charge = charge
        self.dirs: OrderedDict[str, int] = OrderedDict()
        self.dirs[""] = os.open(dest, _DIR)
        self.dir_attrs: dict[str, tuple[int, float]] = {}

    def close(self) -> None:
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()

    def _refuse(self, entry: str, why: str) -> ImageError:
        return ImageError(f"layer {self.name}: entry {entry!r} {why}; refused", retryable=False)

    def _relative(self, name: str) -> str:
        """``name`` as a path in the layer, ``..`` resolved by name ("" for the root)."""
        rel = posixpath.normpath(name.lstrip("/")) if name.strip("/.") else ""
        if rel == "." or not rel:
            return ""
        if rel == ".." or rel.startswith("../"):
            raise self._refuse(name, "leaves the layer")
        if rel.count("/") >= MAX_DEPTH:
            raise self._refuse(name, f"lies more than {MAX_DEPTH} directories deep")
        return rel

    # ------------------------------------------------------------------ directories

    def _dir(self, rel: str, entry: str, create: bool = True) -> int | None:
        """A descriptor of this layer's directory ``rel`` (kept open: never close it),
        walked to from the layer's root without following a link; missing directories are
        made (``create``) or ``None`` is returned.

        Raises:
            ImageError: a component is a symlink or not a directory.
        """
        fd = self.dirs.get(rel)
        if fd is not None:
            self.dirs.move_to_end(rel)
            return fd
        parts = rel.split("/")
        known = len(parts) - 1  # the deepest directory on the way that is open already
        while known and "/".join(parts[:known]) not in self.dirs:
            known -= 1
        fd = self.dirs["/".join(parts[:known])]
        for depth in range(known, len(parts)):
            walked = "/".join(parts[: depth + 1])
            try:
                child = os.open(parts[depth], _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(parts[depth], 0o700, dir_fd=fd)
                self.dir_attrs.setdefault(walked, (0o755, 0.0))
                child = os.open(parts[depth], _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in _NOT_A_DIRECTORY:
                    raise
                raise self._refuse(
                    entry, f"lies below {walked!r}, which is not a directory"
                ) from None
            self.dirs[walked] = fd = child
        return fd

    def _trim(self) -> None:
        """Close the least recently used descriptors past :data:`_OPEN_DIRS` (between
        entries only: a descriptor handed out stays valid for the whole entry)."""
        while len(self.dirs) > _OPEN_DIRS:
            rel, fd = next(iter(self.dirs.items()))
            if rel == "":
                self.dirs.move_to_end(rel)
                continue
            del self.dirs[rel]
            os.close(fd)

    def _clear(self, parent: int, parent_rel: str, name: str) -> None:
        """Remove ``name`` from directory ``parent`` (a directory with what it holds), and
        forget what was recorded about it."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        rel = posixpath.join(parent_rel, name)
        for gone in [d for d in self.dirs if d == rel or d.startswith(rel + "/")]:
            os.close(self.dirs.pop(gone))
        for gone in [d for d in self.dir_attrs if d == rel or d.startswith(rel + "/")]:
            del self.dir_attrs[gone]
        if sys.version_info >= (3, 11):
            shutil.rmtree(name, dir_fd=parent)  # descriptor-based, follows no link
        else:  # the same, from the directory ``parent`` pins
            shutil.rmtree(f"/proc/self/fd/{parent}/{name}")

    # ------------------------------------------------------------------ entries

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        """Create ``member`` (its data read from ``tar``).

        Raises:
            ImageError: the entry is refused (the message says why) or past a cap.
            OSError: the disk refused a write.
        """
        self.stats.entries += 1
        self.charge(ENTRY_COST)
        self._trim()
        rel = self._relative(member.name)
        if not rel:
            return  # the layer's root: the mount point's attributes come from the lowest layer
        try:
            self._add(tar, member, rel)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            raise self._refuse(member.name, "has a name this filesystem cannot hold") from None

    def _add(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str) -> None:
        head, base = posixpath.split(rel)
        parent = self._dir(head, member.name)
        assert parent is not None
        if base == _OPAQUE:
            os.setxattr(parent, OPAQUE_XATTR, b"y")
            return
        if base.startswith(_WHITEOUT):
            hidden = base[len(_WHITEOUT) :]
            if hidden in ("", ".", ".."):
                raise self._refuse(member.name, "is a whiteout of no name")
            self._clear(parent, head, hidden)
            os.mknod(hidden, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=parent)
            return
        if member.isreg():
            self._file(tar, member, parent, head, base)
        elif member.isdir():
            self._directory(member, parent, head, base)
        elif member.issym():
            try:
                os.symlink(member.linkname, base, dir_fd=parent)
            except FileExistsError:
                self._clear(parent, head, base)
                os.symlink(member.linkname, base, dir_fd=parent)
            self._xattrs(member, None)
            os.utime(base, (member.mtime, member.mtime), dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            self._clear(parent, head, base)
            self._hardlink(member, parent, base)
        elif member.isfifo():
            self._clear(parent, head, base)
            self._fifo(member, parent, base)
        elif member.ischr() or member.isblk():
            self._clear(parent, head, base)
            self.stats.devices_skipped += 1
        else:
            raise self._refuse(
                member.name, f"has tar type {member.type!r}, which layers cannot hold"
            )

    def _file(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, head: str, base: str
    ) -> None:
        self.charge(member.size)  # before a byte is written: a bomb allocates nothing
        try:  # no lstat first (most entries): what is in the way is cleared on EEXIST
            fd = os.open(base, _NEW_FILE, 0o600, dir_fd=parent)
        except FileExistsError:  # an earlier entry of this layer had the name: replace it
            self._clear(parent, head, base)
            fd = os.open(base, _NEW_FILE, 0o600, dir_fd=parent)
        try:
            source = tar.extractfile(member)
            assert source is not None
            while chunk := source.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchmod(fd, member.mode & 0o7777)
            os.utime(fd, (member.mtime, member.mtime))
            self._xattrs(member, fd)
        finally:
            os.close(fd)
        self.stats.bytes += member.size

    def _directory(self, member: tarfile.TarInfo, parent: int, head: str, base: str) -> None:
        try:
            os.mkdir(base, 0o700, dir_fd=parent)
        except FileExistsError:  # a directory stays (and merges); anything else goes
            if not stat.S_ISDIR(os.stat(base, dir_fd=parent, follow_symlinks=False).st_mode):
                self._clear(parent, head, base)
                os.mkdir(base, 0o700, dir_fd=parent)
        rel = posixpath.join(head, base)
        fd = self._dir(rel, member.name)
        self.dir_attrs[rel] = (member.mode, float(member.mtime))
        self._xattrs(member, fd)

    def _fifo(self, member: tarfile.TarInfo, parent: int, base: str) -> None:
        os.mkfifo(base, 0o600, dir_fd=parent)
        # O_NONBLOCK: opening a FIFO to read does not wait for a writer.
        fd = os.open(
            base, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
        )
        try:
            os.fchmod(fd, member.mode & 0o7777)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self._xattrs(member, None)

    def _hardlink(self, member: tarfile.TarInfo, parent: int, base: str) -> None:
        """Link ``base`` to the regular file ``member.linkname`` of this layer, or copy it
        from the topmost layer below that has it (what is in the way is cleared already)."""
        target = self._relative(member.linkname)
        if not target:
            raise self._refuse(member.name, "is a hard link to the layer's root")
        head, name = posixpath.split(target)
        here = self._dir(head, member.name, create=False)
        if here is not None and self._regular(here, name, member) is not None:
            try:
                os.link(name, base, src_dir_fd=here, dst_dir_fd=parent, follow_symlinks=False)
                return
            except OSError as exc:
                if exc.errno != errno.EMLINK:  # too many links to one inode: copy it
                    raise
            self._copy(here, name, parent, base, member)
            return
        for layer in self.below():
            with _opened(layer) as root:
                lower = _walk(root, head)
                if lower is None:
                    continue
                try:
                    if self._regular(lower, name, member) is not None:
                        self._copy(lower, name, parent, base, member)
                        return
                finally:
                    os.close(lower)
        raise self._refuse(
            member.name, f"is a hard link to {member.linkname!r}, which no layer has"
        )

    def _regular(self, parent: int, name: str, member: tarfile.TarInfo) -> os.stat_result | None:
        """The status of regular file ``name`` in ``parent``; ``None`` when it is absent or
        a whiteout (deleted there: the layers below are searched).

        Raises:
            ImageError: it is something else (a hard link may point only at a file).
        """
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISREG(st.st_mode):
            return st
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout
            return None
        raise self._refuse(
            member.name, f"is a hard link to {member.linkname!r}, which is not a regular file"
        )

    def _copy(
        self, src_dir: int, name: str, parent: int, base: str, member: tarfile.TarInfo
    ) -> None:
        """Copy regular file ``name`` of ``src_dir`` to ``base`` in ``parent`` with its mode,
        times and ``user.*`` xattrs (read through a descriptor opened without following)."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        src = os.open(name, flags, dir_fd=src_dir)
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):  # it changed since it was looked at
                raise self._refuse(member.name, "is a hard link to a file that changed")
            self.charge(st.st_size)
            dst = os.open(base, _NEW_FILE, 0o600, dir_fd=parent)
            try:
                _copy_data(src, dst, st.st_size)
                for key in os.listxattr(src):
                    if key.startswith("user.") and ".overlay." not in key:
                        os.setxattr(dst, key, os.getxattr(src, key))
                os.fchmod(dst, stat.S_IMODE(st.st_mode))
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dst)
        finally:
            os.close(src)
        self.stats.bytes += st.st_size

    def _xattrs(self, member: tarfile.TarInfo, fd: int | None) -> None:
        """Set ``member``'s ``user.*`` xattrs on ``fd`` (``None``: a symlink or a FIFO, which
        Linux gives no ``user.*`` xattrs); count the others as skipped."""
        for key, value in member.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr.") :]
            if ".overlay." in name:
                raise self._refuse(member.name, f"carries the overlayfs xattr {name!r}")
            data = value.encode("utf-8", "surrogateescape")
            if fd is None or not name.startswith("user."):
                self.stats.xattrs_skipped += 1
                continue
            self.charge(len(data))
            try:
                os.setxattr(fd, name, data)
            except OSError:  # a filesystem without user xattrs, a value too large
                self.stats.xattrs_skipped += 1

    def finish(self) -> None:
        """Directory modes and times, deepest first, each directory re-opened by a walk that
        follows no link (one replaced since is gone from :attr:`dir_attrs` already)."""
        for rel in sorted(self.dir_attrs, key=lambda r: r.count("/"), reverse=True):
            self._trim()
            mode, mtime = self.dir_attrs[rel]
            fd = self._dir(rel, rel, create=False)
            if fd is None:
                continue
            os.fchmod(fd, mode & 0o7777)
            if mtime:
                os.utime(fd, (mtime, mtime))


def _walk(root: int, rel: str) -> int | None:
    """A new descriptor of directory ``rel`` under ``root``, each component opened without
    following a link; ``None`` when it is not there (missing, a file, a symlink: in the
    merged view of that layer the path leads nowhere a hard link may point)."""
    fd = os.dup(root)
    for part in rel.split("/") if rel else ():
        try:
            child = os.open(part, _DIR, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOENT, *_NOT_A_DIRECTORY):
                return None
            raise
        os.close(fd)
        fd = child
    return fd


@contextmanager
def _opened(path: Path) -> Iterator[int]:
    """A descriptor of directory ``path`` (a layer of the cache), for a ``with`` block."""
    fd = os.open(path, _DIR)
    try:
        yield fd
    finally:
        os.close(fd)


def _copy_data(src: int, dst: int, size: int) -> None:
    """``size`` bytes from ``src`` to ``dst`` (in the kernel when it can: a reflink on
    filesystems that share extents)."""
    copied = 0
    with suppress(OSError):
        while copied < size and (n := os.copy_file_range(src, dst, size - copied)):
            copied += n
    if copied < size:
        os.lseek(src, copied, os.SEEK_SET)
        os.lseek(dst, copied, os.SEEK_SET)
        while chunk := os.read(src, _CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
