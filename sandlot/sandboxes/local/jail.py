"""The bubblewrap command line of a sandbox.

The jail's root is bwrap's own tmpfs, read-only once built. Every top-level entry of the image
root (the host's ``/`` for ``image="host"``) is bind-mounted read-only onto it (an empty
directory is just recreated) and top-level symlinks (``/bin -> usr/bin``) are recreated, except
``/proc``, ``/dev``, ``/sys``, ``/tmp`` and ``/run``. Building the root this way, rather than
binding ``/`` itself, leaves room to create new mount points such as the default workdir
``/testbed``. Then:

* fresh ``/proc`` (its ``/proc/sys`` bound read-only: with uid 0 many sysctls, e.g.
  ``kernel.core_pattern``, are writable without any capability) and a minimal ``/dev``;
* private, writable: the workdir, ``/tmp`` and ``$HOME`` (``/sandlot/home``), all host
  directories of this sandbox; a tmpfs ``/run``;
* with an environment recipe, the cached virtual environment read-only at its own path and a
  private writable ``/sandlot/overlay`` that pip installs into;
* for ``image="host"``, the ``hidden_paths`` (credential stores of the host user's home,
  password hashes) are covered by an empty read-only directory or ``/dev/null``, and so is the
  host directory holding all sandboxes when it would be visible;
* new PID, IPC, UTS (and, unless the spec allows network, network) namespaces; all capabilities
  dropped; a new session (no TIOCSTI into our terminal); killed when ``bwrap`` dies.

``/sys`` is left out: most of it is writable by uid 0 without capabilities.

Every mount costs bwrap a re-read of the mount table, so the mount list is kept short.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandlot.sandboxes.local.hostdirs import HostDirs

JAIL_HOME = "/sandlot/home"
"""``$HOME`` inside the jail: a private directory; the host user's own home stays read-only."""

JAIL_OVERLAY = "/sandlot/overlay"
"""Private writable prefix inside the jail where pip installs on top of a read-only environment
(``PIP_PREFIX``); see :mod:`sandlot.sandboxes.local.venv`."""

JAIL_CGROUP_PROCS = "/sandlot/cgroup.procs"
"""Where the sandbox's ``cgroup.procs`` is bound inside the jail, so commands can join it."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` inside jails built from a root filesystem directory."""

# Provided fresh by bwrap (/proc, /dev), private (/tmp, /run) or left out (/sys).
_NOT_FROM_IMAGE = frozenset({"proc", "dev", "sys", "tmp", "run"})


@dataclass(frozen=True)
class JailConfig:
    """Everything that shapes the jail of one sandbox.

    Attributes:
        bwrap: path of the bwrap executable.
        rootfs: root of the image on the host (``/`` for ``image="host"``).
        workdir: absolute workdir inside the jail.
        dirs: the sandbox's host directories.
        network: share the host's network namespace.
        hidden: host paths to cover when the image is the host; ``~/`` already expanded.
        sandboxes_dir: host directory that holds every sandbox's directory (covered when the
            image is the host, so sandboxes cannot read each other's files).
        cgroup_procs: host path of the sandbox's ``cgroup.procs``, or ``None``.
        environment: host directory of the sandbox's cached virtual environment, bound
            read-only at the same path (its scripts name their interpreter by that path), or
            ``None``.
    """

    bwrap: str
    rootfs: Path
    workdir: str
    dirs: HostDirs
    network: bool
    hidden: Sequence[str] = ()
    sandboxes_dir: Path | None = None
    cgroup_procs: Path | None = None
    environment: Path | None = None


def _top_level(rootfs: Path) -> list[str]:
    argv: list[str] = []
    with os.scandir(rootfs) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in _NOT_FROM_IMAGE:
                continue
            dest = "/" + entry.name
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), dest]
            elif _is_empty_dir(entry.path):
                # Looks the same as a bind, without the cost of a mount.
                mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                argv += ["--perms", f"{mode:04o}", "--dir", dest]
            else:
                argv += ["--ro-bind", entry.path, dest]
    return argv


def _is_empty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None and not os.path.ismount(path)
    except OSError:  # not a directory, or not listable: bind it as it is
        return False


def _covered_top_level(path: str, rootfs: Path) -> bool:
    """``True`` when ``path`` lies under a top-level entry the jail takes from the image."""
    parts = Path(path).parts
    return len(parts) > 1 and parts[1] not in _NOT_FROM_IMAGE and (rootfs / parts[1]).exists()


def _mask(path: str, empty_dir: Path) -> list[str]:
    source = str(empty_dir) if os.path.isdir(path) else "/dev/null"
    return ["--ro-bind", source, path]


def _private_interpreter_binds() -> list[str]:
    """Read-only binds for the running Python when it lives where the jail is private.

    Cached environments are virtualenvs of the base interpreter (``sys.base_prefix``), whose
    ``bin/python`` links to it: under ``/tmp`` it would vanish inside the jail. The caller's
    own virtualenv (``sys.prefix``) stays runnable by absolute path, but is not on ``PATH``.
    """
    argv: list[str] = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        parts = Path(prefix).parts
        if len(parts) > 2 and parts[1] in ("tmp", "run") and os.path.isdir(prefix):
            argv += ["--ro-bind", prefix, prefix]
    return argv


def check_workdir(workdir: str, rootfs: Path) -> str | None:
    """Why ``workdir`` cannot be a mount point in the jail, or ``None`` when it can."""
    if not workdir.startswith("/") or os.path.normpath(workdir) != workdir:
        return f"workdir must be an absolute, normalised path, got {workdir!r}"
    parts = Path(workdir).parts
    if len(parts) < 2 or parts[1] in {"proc", "dev", "sys", "sandlot"}:
        return f"workdir {workdir!r} is reserved"
    inside = rootfs / workdir.lstrip("/")
    if len(parts) > 2 and _covered_top_level(workdir, rootfs) and not inside.is_dir():
        # Its parent is a read-only bind, where bwrap cannot create the mount point.
        return (
            f"workdir {workdir!r} does not exist in the image and its parent is read-only; "
            f"use a new top-level directory (like /testbed) or an existing directory"
        )
    return None


def jail_argv(config: JailConfig) -> list[str]:
    """The static part of the bwrap command line; append ``--chdir DIR -- COMMAND...``.

    Raises:
        OSError: the image root cannot be listed.
    """
    dirs = config.dirs
    argv = [config.bwrap, *_top_level(config.rootfs)]
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if os.path.exists("/proc/sysrq-trigger"):
        argv += ["--ro-bind", "/dev/null", "/proc/sysrq-trigger"]
    argv += ["--dev", "/dev", "--tmpfs", "/run"]
    argv += ["--bind", str(dirs.tmp), "/tmp", "--bind", str(dirs.home), JAIL_HOME]
    argv += ["--bind", str(dirs.work), config.workdir]
    if config.rootfs == Path("/"):
        argv += _private_interpreter_binds()
    if config.cgroup_procs is not None:
        argv += ["--bind", str(config.cgroup_procs), JAIL_CGROUP_PROCS]
    if config.environment is not None:
        argv += ["--ro-bind", str(config.environment), str(config.environment)]
        argv += ["--bind", str(dirs.overlay), JAIL_OVERLAY]
    if config.network and config.rootfs == Path("/"):
        resolv = os.path.realpath("/etc/resolv.conf")
        if resolv.startswith("/run/") and os.path.exists(resolv):
            # systemd-resolved style: the real file lives under /run, which is private here.
            argv += ["--ro-bind", resolv, resolv]
    if config.rootfs == Path("/"):
        # Only the host image shows host paths; a root filesystem directory shows its own.
        hidden = [*config.hidden, *([str(config.sandboxes_dir)] if config.sandboxes_dir else [])]
        for path in hidden:
            if os.path.lexists(path) and _covered_top_level(path, config.rootfs):
                argv += _mask(path, dirs.empty)
    argv += ["--remount-ro", "/"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not config.network:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    return argv
