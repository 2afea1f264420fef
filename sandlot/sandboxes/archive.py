"""Tar archives for ``upload``/``download``: built from trusted host files, extracted with care.

Shared by the backends that move trees as tar files (``local``, ``modal``, ``vefaas``; ``docker``
streams the engine's archive endpoints through :mod:`sandlot.sandboxes.docker.archive`).

What comes out of a sandbox is hostile: an archive member may be absolute, climb out with
``..``, be a device, a hard link to a host file, or be written *through* a symlink placed by an
earlier member. :func:`extract_archive` checks every member right before extracting it, against
the directory tree as it is at that moment, and uses ``tarfile``'s ``data`` filter where the
Python version has it (3.10.12+, 3.11.4+). Symbolic links are kept as links whatever they point
to (a link is inert by itself); what is refused is writing anything through one that leads
outside the destination.
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path

from sandlot.sandboxes.errors import SandboxFileError

_HAS_FILTERS = hasattr(tarfile, "data_filter")


class UnsafeArchiveError(SandboxFileError):
    """An archive coming out of a sandbox tried to write outside its destination."""


def _own_files(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_archive(source: Path, arcname: str, archive: Path) -> None:
    """Write a tar of ``source`` (file or directory tree) to ``archive``, rooted at ``arcname``.

    Symbolic links are stored as links; ownership is dropped.

    Raises:
        FileNotFoundError: ``source`` does not exist.
    """
    if not os.path.lexists(source):
        raise FileNotFoundError(f"no such file or directory: {source}")
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(source, arcname=arcname, recursive=True, filter=_own_files)


def _replace(member: tarfile.TarInfo, **attrs: object) -> tarfile.TarInfo:
    # TarInfo.replace() only exists in Pythons that also have extraction filters.
    clone = copy.copy(member)
    for key, value in attrs.items():
        setattr(clone, key, value)
    return clone


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _checked(member: tarfile.TarInfo, dest: str, top: str, rename_to: str) -> tarfile.TarInfo:
    name = member.name.rstrip("/")
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or parts[0] != top:
        raise UnsafeArchiveError(f"refusing archive member {member.name!r}: outside {top!r}")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"refusing archive member {member.name!r}: special file")
    renamed = "/".join([rename_to, *parts[1:]])
    target = os.path.join(dest, renamed)
    # A symlink member replaces whatever is at its path, so only its parent must be inside;
    # anything else is written through existing links, so its resolved path must be.
    resolved = (
        os.path.join(os.path.realpath(os.path.dirname(target)), os.path.basename(target))
        if member.issym()
        else os.path.realpath(target)
    )
    root = os.path.realpath(dest)
    if not _inside(resolved, root):
        raise UnsafeArchiveError(f"refusing archive member {member.name!r}: leads outside")
    if member.islnk():
        link_parts = member.linkname.split("/")
        if member.linkname.startswith("/") or ".." in link_parts or link_parts[0] != top:
            raise UnsafeArchiveError(f"refusing hard link {member.name!r} -> {member.linkname!r}")
        link_target = os.path.realpath(os.path.join(dest, rename_to, *link_parts[1:]))
        if not _inside(link_target, root):
            raise UnsafeArchiveError(f"refusing hard link {member.name!r}: leads outside")
        member = _replace(member, linkname="/".join([rename_to, *link_parts[1:]]))
    member = _replace(member, name=renamed)
    if not _HAS_FILTERS:
        member.uid, member.gid = os.getuid(), os.getgid()
        member.uname = member.gname = ""
        member.mode &= 0o755 if not member.isdir() else 0o777
    return member


def _filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if member.issym():
        # The data filter refuses absolute or outward links outright; they are kept as links
        # here, and _checked stops every later write through them.
        return _replace(member, uid=None, gid=None, uname=None, gname=None)
    return tarfile.data_filter(member, dest)


def extract_archive(archive: Path, top: str, destination: Path) -> None:
    """Extract ``archive`` (members all under ``top``) so that ``top`` becomes ``destination``.

    Args:
        archive: tar file made inside a sandbox (untrusted).
        top: first path component every member must have.
        destination: host path the ``top`` member becomes; its parent is created if missing.

    Raises:
        UnsafeArchiveError: a member is absolute, leaves the destination, or is a special file.
    """
    parent, name = os.path.split(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    with tarfile.open(archive, "r") as tar:
        for member in tar:
            checked = _checked(member, parent, top, name)
            if _HAS_FILTERS:
                tar.extract(checked, parent, set_attrs=not checked.issym(), filter=_filter)
            else:
                tar.extract(checked, parent, set_attrs=not checked.issym())
