"""The host directories of one local sandbox, and their removal."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

SANDLOT_LOCAL_ROOT_ENV = "SANDLOT_LOCAL_ROOT"


def sandboxes_dir(configured: str | None) -> Path:
    """The host directory holding every sandbox's directory.

    Args:
        configured: ``LocalOptions.root_dir``; ``None`` falls back to ``$SANDLOT_LOCAL_ROOT``,
            then to ``sandlot-local-<uid>`` in the system temporary directory.
    """
    if configured:
        return Path(configured).absolute()
    if os.environ.get(SANDLOT_LOCAL_ROOT_ENV):
        return Path(os.environ[SANDLOT_LOCAL_ROOT_ENV]).absolute()
    return Path(tempfile.gettempdir()) / f"sandlot-local-{os.getuid()}"


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

    def create(self) -> None:
        """Create ``root`` (mode 0700; its parent must exist) and the sub-directories.

        Raises:
            FileExistsError: ``root`` already exists.
        """
        self.root.mkdir(mode=0o700)
        for sub in (self.work, self.tmp, self.home, self.empty, self.overlay, self.transfer):
            sub.mkdir()
        self.tmp.chmod(0o1777)
        self.empty.chmod(0o555)

    def exists(self) -> bool:
        """``True`` while the workdir is still there (nobody removed the sandbox from outside)."""
        return self.work.is_dir()

    def remove(self) -> None:
        """Delete ``root`` and everything in it, including read-only files and directories."""
        remove_tree(self.root)


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
