"""The host directories of one local sandbox, and their removal."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandlot.settings import settings

LABELS_FILE = "labels.json"
"""In each sandbox's directory: ``{"labels": {...}, "pid": caller}``, read by the reaper."""


def sandboxes_dir(configured: str | None) -> Path:
    """The host directory holding every sandbox's directory.

    Args:
        configured: ``LocalOptions.root_dir``; ``None`` falls back to ``$SANDLOT_LOCAL_ROOT``,
            then to ``sandlot-local-<uid>`` in the system temporary directory.
    """
    if configured:
        return Path(configured).absolute()
    if root := settings().local_root:
        return Path(root).absolute()
    return Path(tempfile.gettempdir()) / f"sandlot-local-{os.getuid()}"


def foreign_dir(path: Path) -> str | None:
    """Why the directory holding every sandbox, ``path``, cannot be trusted, or ``None``.

    The default one lies in the shared temporary directory under a name anyone can guess: a
    directory (or symlink) made there first by another user would let that user read our
    sandboxes' files and swap them for symlinks that our own writes and removals then follow.
    So it must be a real directory, ours, that nobody else may write to.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot inspect the sandboxes' directory {path}: {exc}"
    fix = "remove it, or set LocalOptions.root_dir ($SANDLOT_LOCAL_ROOT) to a directory of yours"
    if not stat.S_ISDIR(st.st_mode):
        return f"the sandboxes' directory {path} is not a directory (a symlink?): {fix}"
    if st.st_uid != os.geteuid():
        return (
            f"the sandboxes' directory {path} belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}), who could read and replace your sandboxes' files: {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the sandboxes' directory {path} is writable by others (mode {st.st_mode:o}): {fix}"
    return None


@dataclass(frozen=True)
class HostDirs:
    """The host directories of one sandbox, all inside ``root``.

    Attributes:
        root: the sandbox's directory; removed on close.
    """

    root: Path

    @property
    def work(self) -> Path:
        """Bound on the workdir."""
        return self.root / "work"

    @property
    def tmp(self) -> Path:
        """Bound on ``/tmp``."""
        return self.root / "tmp"

    @property
    def home(self) -> Path:
        """Bound on ``$HOME``."""
        return self.root / "home"

    @property
    def empty(self) -> Path:
        """An empty directory, bound read-only over hidden host directories."""
        return self.root / "empty"

    @property
    def overlay(self) -> Path:
        """Bound on ``JAIL_OVERLAY``: where pip installs on top of a read-only environment."""
        return self.root / "overlay"

    @property
    def transfer(self) -> Path:
        """Staging area for upload/download archives; never visible to commands."""
        return self.root / "transfer"

    def create(self, disk_mb: int | None = None) -> None:
        """Create ``root`` (mode 0700; its parent must exist) and the sub-directories every
        sandbox uses (``work``, ``tmp``, ``home``); the others on demand (:meth:`ensure`), as
        each directory costs a sandbox's start and close about 0.1 ms.

        Args:
            disk_mb: when given, ``root`` is a tmpfs of that many MiB (``mount -t tmpfs``,
                which needs root or CAP_SYS_ADMIN): every writable directory of the sandbox
                shares that budget, and a full budget fails writes with ENOSPC. tmpfs pages
                live in memory (or swap).

        Raises:
            FileExistsError: ``root`` already exists.
            OSError: the tmpfs could not be mounted (the message says why).
        """
        self.root.mkdir(mode=0o700)
        if disk_mb is not None:
            options = f"size={disk_mb}m,mode=0700,nosuid,nodev"
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "sandlot-disk", str(self.root)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                self.root.rmdir()
                raise OSError(
                    f"disk_mb needs a size-limited tmpfs, and mounting one failed "
                    f"({done.stderr.strip() or done.returncode}); it needs root or "
                    f"CAP_SYS_ADMIN: leave disk_mb unset otherwise"
                )
        for sub in (self.work, self.tmp, self.home):
            sub.mkdir()
        self.tmp.chmod(0o1777)

    @staticmethod
    def ensure(sub: Path, mode: int = 0o700) -> Path:
        """Create ``sub`` (one of the properties: ``empty`` with mode 0555, ``overlay``,
        ``transfer``) if missing; return it.

        Raises:
            OSError: it cannot be created.
        """
        if not sub.is_dir():
            sub.mkdir(exist_ok=True)
            sub.chmod(mode)
        return sub

    def exists(self) -> bool:
        """``True`` while the workdir is still there (nobody removed the sandbox from outside)."""
        return self.work.is_dir()

    def write_labels(self, labels: Mapping[str, str]) -> None:
        """Record the sandbox's labels and our pid for ``sandlot gc`` (:data:`LABELS_FILE`)."""
        data = {"labels": dict(labels), "pid": os.getpid()}
        (self.root / LABELS_FILE).write_text(json.dumps(data))

    @property
    def shim_bin(self) -> Path:
        """``~/.local/bin`` of the sandbox, where its ``python`` link to ``python3`` goes."""
        return self.home / ".local" / "bin"

    def remove_if_empty(self) -> bool:
        """Delete ``root`` when its sub-directories are empty (a sandbox that wrote nothing but
        its ``python`` link):
        a few syscalls, cheaper than a thread hop for :meth:`remove`. ``False`` (whatever
        remains is left for :meth:`remove`) when anything else is there or ``root`` is a
        mount point."""
        if os.path.ismount(self.root):
            return False
        try:
            (self.root / LABELS_FILE).unlink(missing_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (self.shim_bin / "python").unlink()
                self.shim_bin.rmdir()
                self.shim_bin.parent.rmdir()
            for sub in (self.work, self.tmp, self.home, self.empty, self.overlay, self.transfer):
                with contextlib.suppress(FileNotFoundError):
                    sub.rmdir()
            self.root.rmdir()
        except OSError:
            return False
        return True

    def remove(self) -> None:
        """Delete ``root`` and everything in it, including read-only files and directories,
        unmounting its tmpfs first (``disk_mb``)."""
        unmount(self.root)
        remove_tree(self.root)


def unmount(path: Path) -> None:
    """Lazily unmount ``path`` when it is a mount point (a sandbox's ``disk_mb`` tmpfs)."""
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _make_dirs_writable(root: Path) -> None:
    # Top-down: each directory is made writable and searchable before the walk lists it.
    os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) | stat.S_IRWXU)
    for parent, dirnames, _ in os.walk(root, onerror=lambda _exc: None):
        for name in dirnames:
            path = os.path.join(parent, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXU)


def remove_tree(path: Path) -> None:
    """``rm -rf path``, also when commands left read-only directories (git objects,
    ``chmod -R a-w``): removing an entry needs write permission on its directory.

    Raises:
        OSError: the tree cannot be removed even after making its directories writable.
    """
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
    except OSError:
        _make_dirs_writable(path)
        shutil.rmtree(path)


def copy_tree(source: Path, dest: Path) -> None:
    """Copy the directory tree ``source`` into the existing directory ``dest`` (links kept)."""
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
