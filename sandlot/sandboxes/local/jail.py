"""The bubblewrap command line of a sandbox.

One jail per sandbox, built once at start; its PID 1 is the sandbox's init
(:mod:`sandlot.sandboxes.local.init`, ``--as-pid-1``), which runs every command.

The jail's root is bwrap's own tmpfs, read-only once built. Top-level entries of the image root
are bind-mounted read-only onto it (an empty directory is just recreated) and top-level
symlinks (``/bin -> usr/bin``) are recreated, never ``/proc``, ``/dev``, ``/sys``, ``/tmp`` and
``/run``. For a root filesystem directory that is every entry; for ``image="host"`` with
``host_view="minimal"`` (the default) only the system directories :data:`MINIMAL_HOST_DIRS`,
plus, read-only at their own paths, the interpreters the init and the environment need; with
``host_view="full"`` every entry of the host's ``/``. Building the root this way, rather than
binding ``/`` itself, leaves room to create new mount points such as the default workdir
``/testbed``. Then:

* fresh ``/proc`` (its ``/proc/sys`` bound read-only: with uid 0 many sysctls, e.g.
  ``kernel.core_pattern``, are writable without any capability) and a minimal ``/dev``;
* private, writable: the workdir, ``/tmp`` and ``$HOME`` (``/sandlot/home``), all host
  directories of this sandbox; a tmpfs ``/run``;
* with an environment recipe, the cached virtual environment read-only at its own path and a
  private writable ``/sandlot/overlay`` that pip installs into;
* for ``image="host"``, :data:`ETC_CREDENTIALS` and (visible only with ``host_view="full"``)
  the ``hidden_paths`` (credential stores of the host user's home) are covered by an empty
  read-only directory or ``/dev/null``, and so is the host directory holding all sandboxes
  when it would be visible;
* new PID, IPC, UTS (and, unless the spec allows network, network) namespaces; all capabilities
  dropped; a new session (no TIOCSTI into our terminal); killed when ``bwrap`` dies.

``/sys`` is left out: most of it is writable by uid 0 without capabilities.

Every mount costs bwrap a re-read of the mount table, so the mount list is kept short.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandlot.sandboxes.local.hostdirs import HostDirs

JAIL_HOME = "/sandlot/home"
"""``$HOME`` inside the jail: a private directory; the host user's own home stays read-only."""

JAIL_OVERLAY = "/sandlot/overlay"
"""Private writable prefix inside the jail where pip installs on top of a read-only environment
(``PIP_PREFIX``); see :mod:`sandlot.sandboxes.local.venv`."""


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` inside jails built from a root filesystem directory."""

# Provided fresh by bwrap (/proc, /dev), private (/tmp, /run) or left out (/sys).
_NOT_FROM_IMAGE = frozenset({"proc", "dev", "sys", "tmp", "run"})

MINIMAL_HOST_DIRS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"})
"""Top-level host directories a ``host_view="minimal"`` jail shows (read-only)."""

ETC_CREDENTIALS: tuple[str, ...] = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssl/private",
    "/etc/containers/auth.json",
    "/etc/docker/key.json",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
)
"""Credentials under ``/etc`` masked in every ``image="host"`` jail (password hashes, TLS and
SSH host private keys, registry logins)."""


@dataclass(frozen=True)
class JailConfig:
    """Everything that shapes the jail of one sandbox.

    Attributes:
        bwrap: path of the bwrap executable.
        rootfs: root of the image on the host (``/`` for ``image="host"``).
        workdir: absolute workdir inside the jail.
        network: share the host's network namespace.
        hidden: host paths to cover when the image is the host; ``~/`` already expanded.
        sandboxes_dir: host directory that holds every sandbox's directory (covered when the
            image is the host, so sandboxes cannot read each other's files).
        environment: host directory of the sandbox's cached virtual environment, bound
            read-only at the same path (its scripts name their interpreter by that path), or
            ``None``.
        host_view: ``"minimal"`` shows only :data:`MINIMAL_HOST_DIRS` of the host image;
            ``"full"`` every top-level directory (see ``LocalOptions.host_view``).
        readonly: host directories bound read-only at their own path when the image is the
            host (interpreters the init and the environment need).
    """

    bwrap: str
    rootfs: Path
    workdir: str
    network: bool
    hidden: tuple[str, ...] = ()
    sandboxes_dir: Path | None = None
    environment: Path | None = None
    host_view: str = "minimal"
    readonly: tuple[str, ...] = ()


def _shown(name: str, rootfs: Path, host_view: str) -> bool:
    """Whether top-level entry ``name`` of the image appears in the jail."""
    if name in _NOT_FROM_IMAGE:
        return False
    return host_view == "full" or rootfs != Path("/") or name in MINIMAL_HOST_DIRS


def _top_level(rootfs: Path, host_view: str) -> tuple[str, ...]:
    # Keyed on the root's mtime, which changes whenever a top-level entry is added or removed.
    return _top_level_cached(rootfs, host_view, os.stat(rootfs).st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _top_level_cached(rootfs: Path, host_view: str, mtime_ns: int) -> tuple[str, ...]:
    argv: list[str] = []
    with os.scandir(rootfs) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if not _shown(entry.name, rootfs, host_view):
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
    return tuple(argv)


def _is_empty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None and not os.path.ismount(path)
    except OSError:  # not a directory, or not listable: bind it as it is
        return False


def _covered_top_level(path: str, rootfs: Path, host_view: str = "full") -> bool:
    """``True`` when ``path`` lies under a top-level entry the jail takes from the image."""
    parts = Path(path).parts
    return len(parts) > 1 and _shown(parts[1], rootfs, host_view) and (rootfs / parts[1]).exists()


def _mask(path: str, empty_dir: Path | None) -> list[str]:
    if not os.path.isdir(path):
        return ["--ro-bind", "/dev/null", path]
    if empty_dir is None:
        return ["--tmpfs", path, "--remount-ro", path]
    return ["--ro-bind", str(empty_dir), path]


def check_workdir(workdir: str, rootfs: Path, host_view: str = "minimal") -> str | None:
    """Why ``workdir`` cannot be a mount point in the jail, or ``None`` when it can."""
    if not workdir.startswith("/") or os.path.normpath(workdir) != workdir:
        return f"workdir must be an absolute, normalised path, got {workdir!r}"
    parts = Path(workdir).parts
    if len(parts) < 2 or parts[1] in {"proc", "dev", "sys", "sandlot"}:
        return f"workdir {workdir!r} is reserved"
    inside = rootfs / workdir.lstrip("/")
    covered = _covered_top_level(workdir, rootfs, host_view)
    if len(parts) > 2 and covered and not inside.is_dir():
        # Its parent is a read-only bind, where bwrap cannot create the mount point.
        return (
            f"workdir {workdir!r} does not exist in the image and its parent is read-only; "
            f"use a new top-level directory (like /testbed) or an existing directory"
        )
    return None


def jail_argv(config: JailConfig, dirs: HostDirs) -> list[str]:
    """The bwrap command line of the jail of the sandbox whose directories are ``dirs``
    (creating the ones it binds that do not exist yet); append ``--chdir DIR -- INIT...``.

    Raises:
        OSError: the image root cannot be listed, or a directory cannot be created.
    """
    argv = _system_argv(config)
    argv += ["--bind", str(dirs.tmp), "/tmp", "--bind", str(dirs.home), JAIL_HOME]
    argv += ["--bind", str(dirs.work), config.workdir]
    for source, dest in _read_only_binds(config):
        argv += ["--ro-bind", source, dest]
    argv += _masks_argv(config, dirs.ensure(dirs.empty, 0o555))
    if config.environment is not None:
        argv += ["--bind", str(dirs.ensure(dirs.overlay)), JAIL_OVERLAY]
    return [*argv, *_namespaces_argv(config), "--cap-drop", "ALL"]


@dataclass(frozen=True)
class ZygoteJail:
    """The jail of a zygote (:mod:`sandlot.sandboxes.local.zygote`).

    Attributes:
        argv: its bwrap command line; append ``-- INIT...``.
        kept: read-only binds below a mount point each sandbox covers with its own directory
            (``/tmp``, ``/run``, the workdir, ...): ``kept[i]`` is bound at ``KEEP/i`` in the
            zygote, and each child binds it back at ``kept[i]`` once its own are in place.
    """

    argv: list[str]
    kept: list[str]


def zygote_jail(config: JailConfig, sandboxes_mount: str, keep: str) -> ZygoteJail:
    """The jail of a zygote making sandboxes of shape ``config``.

    The same jail as :func:`jail_argv` but for each sandbox's own directories: empty mount
    points instead, ``config.sandboxes_dir`` bound at ``sandboxes_mount`` (each child binds its
    own, then detaches it), read-only binds below those mount points set aside under ``keep``,
    and every capability kept (the zygote mounts; its children drop them all).

    Raises:
        OSError: the image root cannot be listed.
    """
    assert config.sandboxes_dir is not None
    covered = ["/tmp", "/run", JAIL_HOME, config.workdir]
    argv = _system_argv(config)
    argv += ["--dir", "/tmp", "--dir", JAIL_HOME, "--dir", config.workdir]
    argv += ["--bind", str(config.sandboxes_dir), sandboxes_mount]
    if config.environment is not None:
        argv += ["--dir", JAIL_OVERLAY]
        covered.append(JAIL_OVERLAY)
    kept: list[str] = []
    for source, dest in _read_only_binds(config):
        if any(os.path.commonpath([dest, top]) == top for top in covered):
            argv += ["--ro-bind", source, f"{keep}/{len(kept)}"]
            kept.append(dest)
        else:
            argv += ["--ro-bind", source, dest]
    argv += _masks_argv(config, None)
    return ZygoteJail([*argv, *_namespaces_argv(config), "--chdir", "/"], kept)


def _system_argv(config: JailConfig) -> list[str]:
    argv = [config.bwrap, *_top_level(config.rootfs, config.host_view)]
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if os.path.exists("/proc/sysrq-trigger"):
        argv += ["--ro-bind", "/dev/null", "/proc/sysrq-trigger"]
    return [*argv, "--dev", "/dev", "--tmpfs", "/run"]


def _read_only_binds(config: JailConfig) -> list[tuple[str, str]]:
    """(source, destination) of the interpreters and the environment."""
    binds: list[tuple[str, str]] = []
    if config.rootfs == Path("/"):
        for path in config.readonly:
            if not _covered_top_level(path, config.rootfs, config.host_view):
                binds.append((path, path))
    if config.environment is not None:
        binds.append((str(config.environment), str(config.environment)))
    if config.network and config.rootfs == Path("/"):
        resolv = os.path.realpath("/etc/resolv.conf")
        if resolv.startswith("/run/") and os.path.exists(resolv):
            # systemd-resolved style: the real file lives under /run, which is private here.
            binds.append((resolv, resolv))
    return binds


def _masks_argv(config: JailConfig, empty: Path | None) -> list[str]:
    """Masks of the host's credentials, covered by ``empty`` (or, when ``None``, by a
    read-only tmpfs)."""
    if config.rootfs != Path("/"):
        return []  # only the host image shows host paths; a root filesystem shows its own
    argv: list[str] = []
    hidden = [*config.hidden, *ETC_CREDENTIALS]
    if config.sandboxes_dir:
        hidden.append(str(config.sandboxes_dir))
    for path in dict.fromkeys(hidden):
        if os.path.lexists(path) and _covered_top_level(path, config.rootfs, config.host_view):
            argv += _mask(path, empty)
    return argv


def _namespaces_argv(config: JailConfig) -> list[str]:
    argv = ["--remount-ro", "/", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not config.network:
        argv.append("--unshare-net")
    return [*argv, "--die-with-parent", "--new-session", "--as-pid-1"]
