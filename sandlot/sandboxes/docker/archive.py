"""Tar archives for ``put_archive`` / ``get_archive`` (Docker Engine API v1.41, "Containers /
Extract an archive of files or folders to a directory" and "Get an archive of a filesystem
resource in a container").

Archives coming from the container are untrusted: the model controls what is in there. They are
extracted with the checks of tarfile's ``data`` filter, done here so they also run on Pythons
older than 3.10.12 (which lack ``filter=``) and still allow absolute symlinks, which real trees
(virtualenvs) contain and which are harmless as long as nothing is written through them.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sandlot.sandboxes.errors import SandboxFileError

# Checks below make the stdlib filter redundant, but without `filter=` Python 3.12/3.13 warn and
# 3.14 applies "data", which rejects absolute symlinks.
_EXTRACT_KW: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}


def file_archive(name: str, data: bytes, mode: int = 0o644) -> bytes:
    """A tar holding one regular file ``name`` (a basename) with ``data``, owned by root."""
    buf = io.BytesIO()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_tree_archive(local: Path, name: str, out: IO[bytes]) -> None:
    """Write to ``out`` a tar of the host file or directory ``local`` renamed to ``name``.

    Symlinks are stored as links; owners become root (uid 0), as with ``write_file``.

    Raises:
        FileNotFoundError: ``local`` does not exist.
    """
    if not os.path.lexists(local):
        raise FileNotFoundError(f"upload source does not exist: {local}")

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.add(str(local), arcname=name, recursive=True, filter=as_root)


def extract_as(tar: tarfile.TarFile, top: str, dest: Path) -> None:
    """Extract the tree at archive member ``top`` so that it becomes the host path ``dest``.

    Members are renamed from ``top/...`` to ``dest.name/...``. Rejected: absolute names, ``..``,
    members outside ``top``, anything whose host path resolves outside ``dest`` (e.g. written
    through a symlink from the archive), and hard links pointing outside. Device and FIFO members
    are skipped; setuid/setgid/sticky bits are cleared; files belong to the calling user.

    Raises:
        SandboxFileError: the archive contains an unsafe member.
    """
    dest = Path(os.path.abspath(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tar.extractall(dest.parent, members=_checked(tar, top, dest), numeric_owner=True, **_EXTRACT_KW)


def _checked(tar: tarfile.TarFile, top: str, dest: Path) -> Iterator[tarfile.TarInfo]:
    # A generator: tarfile extracts each member before asking for the next, so the realpath
    # checks see the symlinks that earlier members created.
    root = os.path.realpath(dest)
    for member in tar:
        member.name = _rename(member.name, top, dest.name)
        path = os.path.join(dest.parent, member.name)
        if member.islnk():
            member.linkname = _rename(member.linkname, top, dest.name)
            _inside(root, os.path.join(dest.parent, member.linkname), member.linkname)
        elif not (member.isreg() or member.isdir() or member.issym()):
            continue
        if member.name != dest.name:
            # tarfile replaces an existing link but writes a file through one: a link's own
            # location only needs a safe parent, anything else must resolve inside.
            link = member.issym() or member.islnk()
            _inside(root, os.path.dirname(path) if link else path, member.name)
        member.mode &= 0o777
        member.uid, member.gid = os.getuid(), os.getgid()
        member.uname = member.gname = ""
        yield member


def _rename(name: str, top: str, new_top: str) -> str:
    parts = name.rstrip("/").split("/")
    if name.startswith("/") or parts[0] != top or ".." in parts:
        raise SandboxFileError(f"refusing unsafe archive member {name!r} (expected under {top!r})")
    return posixpath.join(new_top, *parts[1:])


def _inside(root: str, path: str, name: str) -> None:
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        raise SandboxFileError(f"refusing archive member {name!r}: it would land outside {root}")
