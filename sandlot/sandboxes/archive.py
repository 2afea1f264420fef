"""Tar archives for ``upload``/``download``: built from trusted host files, extracted with care.

The one archive code of every backend (``local``, ``docker``, ``modal``, ``vefaas``).

What comes out of a sandbox is hostile: a member may be absolute, climb out with ``..``, be a
device, a hard link to a host file, a symlink pointing anywhere, a gigabyte of zeros that is 4 KB
on the sandbox's disk (a sparse file), or be meant to be written *through* a symlink placed by an
earlier member or by an earlier download. :func:`extract_archive` therefore does not use
``tarfile``'s extraction at all:

* every member is created with ``openat``-style calls from a directory descriptor, one path
  component at a time with ``O_NOFOLLOW``, so nothing is ever written through a symbolic link;
  an existing link where a member goes is replaced, never followed;
* a symbolic link is recreated only when it is relative and, read from where it sits, stays
  inside the downloaded tree (leading ``..`` no deeper than the link's own depth, no ``..``
  after a name); other links, devices and FIFOs are skipped and listed in the returned
  :class:`DownloadReport`;
* sizes are checked from the tar headers *before* anything is written: one cap per file, one
  for the whole tree, and one on the archive bytes read (headers included).

The archive is read as a stream (``tarfile`` mode ``r|``), so it never has to be stored first.

The in-sandbox half is here too: :func:`tar_create_argv` and :func:`tar_extract_argv` are the
``tar`` commands of the transport's default archive moves (``Transport._get_archive`` and
``_put_archive`` over one staged file), for backends without a native archive endpoint.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sandlot.errors import SandboxFileError

log = logging.getLogger("sandlot.sandboxes.archive")

MiB = 1024 * 1024

DEFAULT_READ_MAX_BYTES = 64 * MiB
"""Default cap in bytes on what one ``read_file`` returns."""
DEFAULT_DOWNLOAD_MAX_BYTES = 1024 * MiB
"""Default cap in bytes on the file contents one ``download`` writes to the host."""
DEFAULT_DOWNLOAD_MAX_FILE_BYTES = 256 * MiB
"""Default cap in bytes on one file written by ``download``."""
ARCHIVE_OVERHEAD_BYTES = 64 * MiB
"""Archive bytes allowed on top of ``max_bytes`` for tar headers and padding (a tree of many
empty files is mostly headers)."""

_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeArchiveError(SandboxFileError):
    """An archive coming out of a sandbox tried to write outside its destination."""


class DownloadLimitError(SandboxFileError):
    """A file or a tree coming out of a sandbox is larger than the caller's cap."""


@dataclass
class DownloadReport:
    """What ``download`` wrote to the host.

    Attributes:
        files: regular files written (hard links included).
        bytes: bytes of file content written.
        skipped: ``(path relative to the destination's parent, reason)`` of each member not
            created: symbolic links that point outside the tree (kept would let a later
            write leave the destination), devices, FIFOs, sockets.
    """

    files: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _own_files(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def file_archive(name: str, data: bytes, mode: int = 0o644) -> bytes:
    """A tar holding one regular file ``name`` (a basename) with ``data``, owned by root."""
    buf = io.BytesIO()
    info = _own_files(tarfile.TarInfo(name))
    info.size, info.mode = len(data), mode
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_archive(source: Path, arcname: str, out: Path | IO[bytes]) -> None:
    """Write a tar of the host file or tree ``source``, rooted at ``arcname``, to ``out``.

    Symbolic links are stored as links; owners become root (uid 0). The source is the caller's
    and trusted.

    Args:
        source: host file or directory.
        arcname: name of the top member (the basename the upload ends up with).
        out: archive path, or a binary file object to write to.

    Raises:
        FileNotFoundError: ``source`` does not exist.
    """
    if not os.path.lexists(source):
        raise FileNotFoundError(f"upload source does not exist: {source}")
    if isinstance(out, Path):
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(source, arcname=arcname, recursive=True, filter=_own_files)
    else:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(source, arcname=arcname, recursive=True, filter=_own_files)


class _Bounded:
    """A read-only stream that fails once more than ``limit`` bytes were read from it."""

    def __init__(self, raw: IO[bytes], limit: int, what: str) -> None:
        self._raw = raw
        self._left = limit
        self._limit = limit
        self._what = what

    def read(self, size: int = -1) -> bytes:
        want = self._left + 1 if size < 0 else min(size, self._left + 1)
        data = self._raw.read(want)
        self._left -= len(data)
        if self._left < 0:
            raise DownloadLimitError(
                f"{self._what}: the archive is larger than {self._limit} bytes "
                "(max_bytes plus room for headers); raise max_bytes or download less"
            )
        return data


def _parts(name: str, top: str | None) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts or (top and parts[0] != top):
        raise UnsafeArchiveError(
            f"refusing archive member {name!r}: absolute, climbing with '..' or outside {top!r}"
        )
    return parts


def link_stays_inside(target: str, depth: int) -> bool:
    """Whether a symlink ``target``, in a directory ``depth`` levels below the tree's top,
    resolves inside the tree however the links it passes through are laid out.

    True for relative targets made of at most ``depth`` leading ``..`` followed by names only
    (``.`` and empty components ignored); a name followed by ``..`` could climb out through
    another link (``l -> d/..`` with ``d -> .``), so it is refused.
    """
    if not target or target.startswith("/"):
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    return ups <= depth and ".." not in parts[ups:]


@contextmanager
def _fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _open_dir(parent: int, name: str, *, create: bool, shown: str) -> int:
    """Open directory ``name`` under the descriptor ``parent`` without following a link."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            with suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeArchiveError(
                    f"refusing archive member {shown!r}: {name!r} on its path is a symbolic "
                    "link or not a directory; nothing is written through links"
                ) from exc
            raise
    raise UnsafeArchiveError(f"refusing archive member {shown!r}: {name!r} keeps changing")


def _clear(parent: int, name: str, shown: str, *, for_dir: bool = False) -> bool:
    """Remove a non-directory at ``name`` (links are removed, not followed).

    Returns whether a directory is there (kept).
    """
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if not for_dir:
            raise SandboxFileError(f"cannot write {shown!r}: a directory is in the way")
        return True
    os.unlink(name, dir_fd=parent)
    return False


class _Extractor:
    def __init__(self, root_fd: int, rename_to: str, max_bytes: int, max_file_bytes: int) -> None:
        self.root_fd = root_fd
        self.rename_to = rename_to
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self.report = DownloadReport()
        self.top: str | None = None

    def parent_of(self, parts: list[str], shown: str, create: bool = True) -> int:
        fd = os.dup(self.root_fd)
        for name in parts[:-1]:
            with _fd(fd):
                fd = _open_dir(fd, name, create=create, shown=shown)
        return fd

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = _parts(member.name, self.top)
        if self.top is None:
            self.top = parts[0]
        parts[0] = self.rename_to
        shown = "/".join(parts)
        if member.isdir():
            with _fd(self.parent_of(parts, shown)) as parent:
                if not _clear(parent, parts[-1], shown, for_dir=True):
                    os.mkdir(parts[-1], 0o700, dir_fd=parent)
                with _fd(_open_dir(parent, parts[-1], create=False, shown=shown)) as fd:
                    os.fchmod(fd, (member.mode & 0o777) | 0o700)
        elif member.isreg():
            self.regular(tar, member, parts, shown)
        elif member.issym():
            if not link_stays_inside(member.linkname, len(parts) - 2):
                self.skip(shown, f"symbolic link to {member.linkname!r} leads outside the tree")
                return
            with _fd(self.parent_of(parts, shown)) as parent:
                _clear(parent, parts[-1], shown)
                os.symlink(member.linkname, parts[-1], dir_fd=parent)
        elif member.islnk():
            source = _parts(member.linkname, self.top)
            source[0] = self.rename_to
            with (
                _fd(self.parent_of(source, shown, create=False)) as src,
                _fd(self.parent_of(parts, shown)) as parent,
            ):
                st = os.stat(source[-1], dir_fd=src, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise UnsafeArchiveError(f"refusing hard link {shown!r}: not to a file")
                _clear(parent, parts[-1], shown)
                os.link(
                    source[-1], parts[-1], src_dir_fd=src, dst_dir_fd=parent, follow_symlinks=False
                )
            self.report.files += 1
        else:
            self.skip(shown, "special file (device, FIFO or socket)")

    def skip(self, shown: str, reason: str) -> None:
        log.warning("download: skipped %s: %s", shown, reason)
        self.report.skipped.append((shown, reason))

    def regular(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str], shown: str
    ) -> None:
        if member.size > self.max_file_bytes:
            raise DownloadLimitError(
                f"download: {shown!r} is {member.size} bytes, above max_file_bytes="
                f"{self.max_file_bytes}; nothing of it was written"
            )
        if self.report.bytes + member.size > self.max_bytes:
            raise DownloadLimitError(
                f"download: {shown!r} ({member.size} bytes) would take the download above "
                f"max_bytes={self.max_bytes} ({self.report.bytes} bytes written so far)"
            )
        source = tar.extractfile(member)
        assert source is not None
        with _fd(self.parent_of(parts, shown)) as parent:
            _clear(parent, parts[-1], shown)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with _fd(os.open(parts[-1], flags, 0o600, dir_fd=parent)) as fd:
                left = member.size
                while left > 0:
                    chunk = source.read(min(_CHUNK, left))
                    if not chunk:
                        raise SandboxFileError(f"download: archive ends inside {shown!r}")
                    _write_all(fd, chunk)
                    left -= len(chunk)
                os.fchmod(fd, member.mode & 0o777)
                os.utime(fd, (member.mtime, member.mtime))
        self.report.files += 1
        self.report.bytes += member.size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def extract_archive(
    stream: IO[bytes] | Path,
    destination: Path,
    *,
    max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES,
    max_file_bytes: int = DEFAULT_DOWNLOAD_MAX_FILE_BYTES,
) -> DownloadReport:
    """Extract the untrusted tar ``stream`` so that its top member becomes ``destination``.

    The directories above ``destination`` are the caller's: created when missing and followed
    as they are. From ``destination`` down nothing is followed (see the module docstring).
    File modes are kept without setuid/setgid/sticky bits (directories also get ``u+rwx``);
    files belong to the calling user.

    Args:
        stream: the archive (a file path, or a stream read once from start to end, such as a
            socket). Every member must sit under the first member's top component.
        destination: host path the top member becomes.
        max_bytes: cap on all file contents, in bytes; the archive itself may be
            :data:`ARCHIVE_OVERHEAD_BYTES` larger.
        max_file_bytes: cap on one file, in bytes.

    Returns:
        The :class:`DownloadReport` (also listing the skipped links and special files).

    Raises:
        UnsafeArchiveError: a member is absolute, leaves the destination, or would be written
            through a symbolic link.
        DownloadLimitError: a file or the tree is above its cap (checked from the tar headers
            before the file is written; what was extracted before stays).
        SandboxFileError: the archive is empty or malformed, or a directory is in the way.
    """
    if isinstance(stream, Path):
        with stream.open("rb") as opened:
            return extract_archive(
                opened, destination, max_bytes=max_bytes, max_file_bytes=max_file_bytes
            )
    parent, name = os.path.split(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    bounded = _Bounded(stream, max_bytes + ARCHIVE_OVERHEAD_BYTES, f"download to {destination}")
    with _fd(os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as root:
        extractor = _Extractor(root, name, max_bytes, max_file_bytes)
        try:
            with tarfile.open(fileobj=bounded, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    extractor.member(tar, member)
        except tarfile.TarError as exc:
            raise SandboxFileError(f"download to {destination}: bad archive: {exc}") from exc
    if extractor.top is None:
        raise SandboxFileError(f"download to {destination}: the sandbox sent an empty archive")
    return extractor.report


def read_single_file(stream: IO[bytes], path: str, max_bytes: int) -> bytes:
    """The content of the first member of the tar ``stream``, a regular file of at most
    ``max_bytes`` bytes (checked from its header before reading it).

    Raises:
        SandboxFileError: empty archive, a directory or not a regular file (messages name
            ``path``); ``DownloadLimitError`` when the file is larger than ``max_bytes``.
    """
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        member = tar.next()
        if member is None:
            raise SandboxFileError(f"read_file: empty archive for {path}")
        if member.isdir():
            raise SandboxFileError(f"read_file: is a directory: {path}")
        if not member.isreg():
            raise SandboxFileError(f"read_file: not a regular file: {path}")
        check_read_size(path, member.size, max_bytes)
        content = tar.extractfile(member)
        assert content is not None
        data: bytes = content.read()
        return data


def check_read_size(path: str, size: int, max_bytes: int) -> None:
    """Raise :class:`DownloadLimitError` when a file of ``size`` bytes exceeds ``max_bytes``."""
    if size > max_bytes:
        raise DownloadLimitError(
            f"read_file {path}: {size} bytes is more than max_bytes={max_bytes}; pass a larger "
            "max_bytes, or read a part with a command (head -c, tail -c, sed -n)"
        )


def tar_extract_argv(archive: str, parent: str) -> list[str]:
    """argv unpacking the tar ``archive`` into directory ``parent`` (created), then deleting it."""
    script = (
        'mkdir -p -- "$1" && tar -x -f "$0" -C "$1" --no-same-owner; rc=$?; rm -f -- "$0"; exit $rc'
    )
    return ["/bin/sh", "-c", script, archive, parent]


def tar_create_argv(path: str, archive: str, max_bytes: int, max_file_bytes: int) -> list[str]:
    """argv packing ``path`` (file or tree, symlinks kept) into the tar ``archive``.

    A symlink at ``path`` itself is resolved first (``readlink -f``), so the archive holds what
    it leads to, as docker's archive endpoint does. A file above ``max_file_bytes`` stops it
    (exit 3, ``... is larger than max_file_bytes=N`` on stderr); the archive is cut at
    ``max_bytes``, so a sparse file costs at most that much to move (the extractor reports the
    cut). Exits 2 with ``no such file or directory: <path>`` on stderr when ``path`` is missing.
    """
    script = (
        'p=$(readlink -f -- "$0") && [ -e "$p" ] '
        '|| { echo "no such file or directory: $0" >&2; exit 2; }; '
        'big=$(find "$p" -type f -size +"$3"c -print -quit); '
        '[ -z "$big" ] || { echo "$big is larger than max_file_bytes=$3" >&2; exit 3; }; '
        '{ tar -c -f - -C "$(dirname -- "$p")" -- "$(basename -- "$p")"; echo $? >"$1.rc"; } '
        '| head -c "$2" >"$1"; rc=$(cat -- "$1.rc"); rm -f -- "$1.rc"; '
        '[ "$rc" = 0 ] || [ "$rc" = 141 ] || exit "$rc"'
    )
    return ["/bin/sh", "-c", script, path, archive, str(max_bytes), str(max_file_bytes)]
