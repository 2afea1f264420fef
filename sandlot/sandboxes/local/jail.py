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

* fresh ``/proc`` in which nothing but the processes' own directories is writable: every
  other top-level entry bound read-only on itself (with uid 0 and no capability, many
  sysctls such as ``kernel.core_pattern``, ``/proc/irq/*/smp_affinity``, ``/proc/pressure/*``
  and ``/proc/bus/pci`` are writable, and ``chmod`` of any top-level entry changes its mode
  for the whole machine), Docker's masked paths (:data:`PROC_MASKED`) covered, and the init's
  descriptor directories (:data:`INIT_FDS`) covered; and a minimal ``/dev``;
* private, writable: the workdir, ``/tmp`` and ``$HOME`` (``/sandlot/home``), all host
  directories of this sandbox; a tmpfs ``/run``;
* with an environment recipe, the cached virtual environment read-only at its own path and a
  private writable ``/sandlot/overlay`` that pip installs into;
* for ``image="host"``, :data:`ETC_CREDENTIALS` and (visible only with ``host_view="full"``)
  the ``hidden_paths`` (credential stores of the host user's home) are covered by an empty
  read-only directory or ``/dev/null``, and so is the host directory holding all sandboxes
  when it would be visible;
* new PID, IPC, UTS (for a container image with the sandbox's own hostname) and (unless the
  spec allows network) network namespaces, and for a caller who is not root a user namespace
  where the caller is uid 0; all capabilities dropped; the seccomp filter
  :func:`keyring_filter`; a new session (no TIOCSTI into our terminal); killed when ``bwrap``
  dies.

``/sys`` is left out: most of it is writable by uid 0 without capabilities.

Every mount costs bwrap a re-read of the mount table, so the mount list is kept short; the
about 50 of ``/proc`` cost a ``zygote=False`` start 6 ms on 2 idle cores, up to 15 under load
(a zygote's spare makes them with ``mount(2)`` in about 1.3 ms, before it is asked for a
sandbox).
"""

from __future__ import annotations

import functools
import os
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandlot.images.tools import find_tool
from sandlot.sandboxes.local.freeze import OVERLAY_WORK, UPPER
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

PROC_MASKED = frozenset(
    {"acpi", "asound", "interrupts", "kcore", "keys", "latency_stats", "sched_debug", "scsi",
     "timer_list", "timer_stats"}
)  # fmt: skip
"""Top-level ``/proc`` entries covered in every jail by an empty read-only directory or
``/dev/null``: Docker's default ``maskedPaths`` under ``/proc`` (moby,
``daemon/pkg/oci/defaults.go``). Every other top-level entry that is not a process's (see
:func:`proc_covered`) is bound read-only on itself."""


# seccomp(2): struct seccomp_data is (int nr, u32 arch, ...); audit architectures and the
# numbers of add_key, request_key and keyctl on each (native, then compat).
_SECCOMP_ARCHES = {
    "x86_64": ((0xC000003E, (248, 249, 250)), (0x40000003, (286, 287, 288))),
    "aarch64": ((0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))),
}
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same numbers with this bit
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_AND_K, _BPF_RET_K = 0x20, 0x15, 0x54, 0x06
_RET_ALLOW, _RET_EPERM, _RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38


@functools.cache
def keyring_filter(machine: str | None = None) -> bytes | None:
    """A seccomp filter (``struct sock_filter`` array, as ``bwrap --seccomp`` reads it) that
    fails ``add_key``, ``request_key`` and ``keyctl`` with ``EPERM``, as Docker's default
    profile does, and every system call of an unknown architecture with ``ENOSYS``; ``None``
    on a machine without numbers here (``machine``: :func:`os.uname`'s, by default).

    The kernel's keyrings are per user, not per namespace: a command of any sandbox (uid 0)
    could otherwise add keys to, and read the keys of, uid 0's user keyring, which the host's
    root and every other sandbox share.
    """
    arches = _SECCOMP_ARCHES.get(machine or os.uname().machine)
    if arches is None:
        return None
    program: list[tuple[int, int, int, int]] = [(_BPF_LD_W_ABS, 0, 0, 4)]  # arch
    for arch, numbers in arches:
        block: list[tuple[int, int, int, int]] = [(_BPF_LD_W_ABS, 0, 0, 0)]  # nr
        if arch == 0xC000003E:
            block.append((_BPF_AND_K, 0, 0, 0xFFFFFFFF & ~_X32_BIT))
        for i, number in enumerate(numbers):
            # to the EPERM return after the last comparison
            block.append((_BPF_JEQ_K, len(numbers) - i, 0, number))
        block += [(_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, _RET_EPERM)]
        program += [(_BPF_JEQ_K, 0, len(block), arch), *block]
    program.append((_BPF_RET_K, 0, 0, _RET_ENOSYS))
    return b"".join(struct.pack("=HBBI", *op) for op in program)


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
        layers: for a container image, its unpacked layers, topmost first
            (:class:`sandlot.images.ImageRoot`): the jail's root is then ``rootfs``, an
            overlayfs of them under a private writable layer, mounted by bwrap itself when it can
            (:func:`bwrap_mounts_overlay`), else by :func:`overlay_argv`.
        user: (uid, gid) the jail's processes run as, in a user namespace of their own where
            that id owns what root owns outside it (an image's non-root ``User``); ``None``:
            root.
        work_layers: without ``layers``, for a fork of a snapshot (``image="host"`` or a root
            filesystem directory): the snapshot's frozen workdir, read-only below the
            sandbox's own writable ``upper``; the workdir is then an overlayfs of them,
            mounted on the sandbox's ``work`` directory by :func:`overlay_argv`.
        layer_store: only in the shape of a zygote of container images
            (:func:`sandlot.sandboxes.local.zygote_client.image_request`): the directory
            holding the image cache's unpacked layers, bound read-only in the zygote.
        hostname: the jail's UTS hostname (``--hostname``), for a container image (see
            :mod:`sandlot.sandboxes.local.runtime_files`); ``None`` keeps the host's.
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
    layers: tuple[Path, ...] = ()
    user: tuple[int, int] | None = None
    work_layers: tuple[Path, ...] = ()
    layer_store: Path | None = None
    hostname: str | None = None


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
    empty = dirs.ensure(dirs.empty, 0o555)
    native = bool(config.layers) and bwrap_mounts_overlay(config)
    argv = _system_argv(config, _proc_argv(empty), overlay_dirs(dirs) if native else None)
    argv += ["--bind", str(dirs.tmp), "/tmp", "--bind", str(dirs.home), JAIL_HOME]
    if config.layers:  # the workdir is the image's, in the writable root: nothing to copy
        argv += ["--dir", config.workdir]
    else:
        argv += ["--bind", str(dirs.work), config.workdir]
    for source, dest in _read_only_binds(config):
        argv += ["--ro-bind", source, dest]
    argv += _masks_argv(config, empty)
    if config.environment is not None:
        argv += ["--bind", str(dirs.ensure(dirs.overlay)), JAIL_OVERLAY]
    mounted_before = (config.layers and not native) or config.work_layers
    prefix = overlay_argv(config, dirs) if mounted_before else []
    # overlay_argv's user namespace already makes the caller root; a caller who is not root
    # otherwise gets bwrap's own namespace, where it keeps its uid: root there, as the zygote's.
    root_namespace = native or (not mounted_before and not caller_is_root())
    return [*prefix, *argv, *_namespaces_argv(config, root_namespace), "--cap-drop", "ALL"]


def caller_is_root() -> bool:
    """Whether this process runs as real root. Otherwise bwrap (not setuid) runs every jail
    in a user namespace of its own, where it drops every capability unless told
    (``--cap-add``), and the jail's root is the caller outside it."""
    return os.geteuid() == 0


_MOUNT_SCRIPT = (
    'cd "$1" && "$2" -t overlay overlay -o "userxattr,lowerdir=$3,upperdir=$4,workdir=$5" "$6" '
    '&& shift 6 && exec "$@"'
)


_FUSE_SCRIPT = (
    'f="$1"; s="$2"; m="$3"; n="$4"; shift 4; while [ "$n" -gt 0 ]; do '
    '( for p in /proc/self/fd/*; do d="${p##*/}"; [ "$d" -gt 2 ] && eval "exec $d>&-"; done; '
    'exec "$s" --pdeathsig KILL "$f" -f -o ro,nosuid,nodev "$1" "$2" ) & '
    'i=0; until "$m" -q "$2"; do i=$((i + 1)); '
    'if [ "$i" -gt 2000 ] || ! kill -0 $! 2>/dev/null; then exit 125; fi; done; '
    "shift 2; n=$((n - 1)); done; " + _MOUNT_SCRIPT
)
""":data:`_MOUNT_SCRIPT` after ``squashfuse`` mounted each layer image (``SQUASHFUSE SETPRIV
MOUNTPOINT N IMAGE MNT...``):
in the foreground, with none of our descriptors (the init's socket, bwrap's info pipe), and
killed when its parent dies (``setpriv --pdeathsig``: that parent becomes bwrap, so the FUSE
daemons live exactly as long as the jail); each mount waited for before the next."""

ZYGOTE_LAYER_MOUNTS = "/sandlot/.mounts"
"""In a zygote of images: where it mounts the layer images its sandboxes stack."""

LAYER_MOUNTS = "layer-mounts"
"""Under a sandbox's directory: where its layer images are mounted (in its own namespace)."""


def is_layer_image(layer: Path) -> bool:
    """Whether ``layer`` is a squashfs image file to mount (else a directory)."""
    return layer.suffix == ".sqfs"


_OVERLAY_OPTIONS_MAX = 4000
"""Bytes of the overlay mount options bwrap may write (``mount(2)`` takes one page): past
it, the layers are named relative to their directory by :func:`overlay_argv` instead."""


@functools.lru_cache(maxsize=8)
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    """``(0, 11, 0)`` for the bwrap at ``bwrap`` that says ``bubblewrap 0.11.0``; ``()`` when
    it says nothing readable (asked once per path and process)."""
    try:
        done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
        version = done.stdout.split()[-1]  # "bubblewrap 0.11.0"
        return tuple(int(part) for part in version.split("."))
    except (OSError, IndexError, ValueError):
        return ()


def bwrap_mounts_overlay(config: JailConfig) -> bool:
    """Whether ``config.bwrap`` mounts the image's overlay itself (``--overlay``, bubblewrap
    0.9, with ``userxattr`` when unprivileged), in place of :func:`overlay_argv`'s ``unshare``,
    ``sh`` and ``mount``: three processes run one after the other before bwrap (a bare jail of
    an image: 26 ms with them, 14 ms without, on 2 loaded cores). Only when its mount options
    fit in a page (bwrap names each layer in full)."""
    if any(is_layer_image(layer) for layer in config.layers):
        return False  # they are mounted first, in the namespace overlay_argv makes
    size = sum(len(str(layer)) + len(":/oldroot") for layer in config.layers)
    return bwrap_version(config.bwrap) >= (0, 9) and size < _OVERLAY_OPTIONS_MAX


def overlay_dirs(dirs: HostDirs) -> tuple[Path, Path]:
    """The sandbox's writable layer and overlayfs's work directory (created)."""
    return dirs.ensure(dirs.root / UPPER, 0o755), dirs.ensure(dirs.root / OVERLAY_WORK)


def overlay_argv(config: JailConfig, dirs: HostDirs) -> list[str]:
    """The command that runs bwrap (append its argv) once ``config.rootfs`` is an overlayfs of
    ``config.layers`` under the sandbox's own writable ``upper`` directory (or, with
    ``config.work_layers`` instead, the sandbox's ``work`` directory one of those).

    util-linux's ``unshare`` makes a user and mount namespace (the caller is root in it, as
    rootless podman is) where the kernel lets an unprivileged user mount overlayfs (Linux
    5.11, with ``userxattr``); ``mount`` mounts it, then ``exec`` turns that process into bwrap,
    so the mount lives exactly as long as the jail. The lower layers are named relative to
    their common directory: ``mount`` options are limited to one page.

    Layers that are squashfs image files are first mounted with ``squashfuse`` in that
    namespace, on directories under the sandbox's :data:`LAYER_MOUNTS` (see
    :data:`_FUSE_SCRIPT`: the daemons die with bwrap).

    Raises:
        BackendUnavailableError: ``unshare``, ``mount``, ``sh`` (``bash``, ``setpriv``,
            ``mountpoint`` and ``squashfuse`` for layer images) is missing.
        OSError: the sandbox's overlay directories cannot be created.
    """
    layers, target = config.layers, config.rootfs
    if not layers:
        layers, target = config.work_layers, dirs.work
    images = [layer for layer in layers if is_layer_image(layer)]
    parent = dirs.ensure(dirs.root / LAYER_MOUNTS) if images else dirs.root
    mounts = {layer: dirs.ensure(parent / str(i)) for i, layer in enumerate(images)}
    lowers = [mounts.get(layer, layer) for layer in layers]
    base = os.path.commonpath([str(p.parent) for p in lowers])
    lower = ":".join(os.path.relpath(p, base) for p in lowers)
    upper, work = overlay_dirs(dirs)
    target.mkdir(exist_ok=True)
    unshare = [find_tool("unshare"), "--user", "--map-root-user", "--mount"]
    mount_args = [base, find_tool("mount"), lower, str(upper), str(work), str(target)]
    if not images:
        script = [find_tool("sh"), "-c", _MOUNT_SCRIPT, "sandlot-overlay"]
        return [*unshare, *script, *mount_args]
    fuse = [find_tool(t) for t in ("squashfuse", "setpriv", "mountpoint")] + [str(len(images))]
    fuse += [str(p) for layer in images for p in (layer, mounts[layer])]
    # bash: dash closes only descriptors 0-9
    script = [find_tool("bash"), "-c", _FUSE_SCRIPT, "sandlot-overlay"]
    return [*unshare, *script, *fuse, *mount_args]


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


def zygote_jail(
    config: JailConfig, sandboxes_mount: str, keep: str, layers_mount: str
) -> ZygoteJail:
    """The jail of a zygote making sandboxes of shape ``config``.

    The same jail as :func:`jail_argv` but for each sandbox's own directories: empty mount
    points instead, ``config.sandboxes_dir`` bound at ``sandboxes_mount`` (each child binds its
    own, then detaches it), ``config.layer_store`` (if any) read-only at ``layers_mount``,
    read-only binds below those mount points set aside under ``keep``, and every capability
    kept (the zygote mounts; its children drop them all).

    Raises:
        OSError: the image root cannot be listed.
    """
    assert config.sandboxes_dir is not None
    covered = ["/tmp", "/run", JAIL_HOME, config.workdir]
    # Each child mounts its own /proc over this one (and covers it as _proc_argv does).
    argv = _system_argv(config, ["--proc", "/proc"], None)
    argv += ["--dir", "/tmp", "--dir", JAIL_HOME]
    if config.layer_store is None:
        argv += ["--dir", config.workdir]
    else:  # each child makes the workdir in its image (the host's /usr may hold it here)
        argv += ["--ro-bind", str(config.layer_store), layers_mount]
        # Layer images are mounted here by the zygote (FUSE daemons in its PID namespace).
        argv += ["--tmpfs", ZYGOTE_LAYER_MOUNTS, "--dev-bind-try", "/dev/fuse", "/dev/fuse"]
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
    # A zygote of images, or of any jail for a caller who is not root, is root in a user
    # namespace of its own, with every capability there (bwrap drops them for a caller that
    # is not root unless told): its children enter namespaces and mount, and its sandboxes
    # are root in that namespace, as with their own bwrap.
    own_namespace = config.layer_store is not None or not caller_is_root()
    argv += _namespaces_argv(config, root_namespace=own_namespace)
    argv += ["--cap-add", "ALL"] if own_namespace else []
    return ZygoteJail([*argv, "--chdir", "/"], kept)


INIT_FDS = ("/proc/1/fd", "/proc/1/task/1/fd")
"""Covered by an empty read-only directory in every jail, whose PID 1 is the init (bwrap's
``--as-pid-1``, a zygote's spare) and single-threaded: the init is not dumpable, so no command
can open its descriptors, but the owner of ``/proc/1/fd`` (uid 0, as every command) may still
list their numbers."""


def proc_covered(proc: str = "/proc") -> list[tuple[str, bool]]:
    """(name, is a directory) of each top-level entry of the procfs at ``proc`` that describes
    the machine rather than a process: all but the PID directories and the symlinks (``self``,
    ``thread-self``, ``mounts``, ``net``: each leads into the reader's own PID directory).

    Listed anew for every jail: a kernel module loaded since (sound, SCSI, a GPU driver) adds
    entries. The zygote's copy of this rule is ``zygote._cover_proc``.
    """
    with os.scandir(proc) as entries:
        return [
            (entry.name, entry.is_dir(follow_symlinks=False))
            for entry in entries
            if not entry.name.isdigit() and not entry.is_symlink()
        ]


def _proc_argv(empty: Path) -> list[str]:
    """A fresh ``/proc`` whose every entry outside the processes' own is read-only (with uid 0
    and no capability, ``/proc/irq/*/smp_affinity``, ``/proc/pressure/*``, ``/proc/bus/pci``
    and many sysctls are writable, and ``chmod`` of any top-level entry changes its mode for
    the whole machine) or, for :data:`PROC_MASKED`, covered by ``empty`` or ``/dev/null``.

    The sources are the host's entries, which show the same kernel-wide state (those that
    depend on a namespace read the reader's, e.g. ``sysvipc``); ``-try``: an entry that
    vanished since it was listed (a module unloaded) is skipped.
    """
    argv = ["--proc", "/proc"]
    for name, is_dir in proc_covered():
        path = f"/proc/{name}"
        if name in PROC_MASKED:
            argv += ["--ro-bind-try", str(empty) if is_dir else "/dev/null", path]
        else:
            argv += ["--ro-bind-try", path, path]
    for path in INIT_FDS:
        argv += ["--ro-bind", str(empty), path]
    return argv


def _system_argv(
    config: JailConfig, proc: list[str], overlay: tuple[Path, Path] | None
) -> list[str]:
    if overlay is not None:  # an image, its overlay mounted by bwrap: lowest layer first
        sources = [
            arg for layer in reversed(config.layers) for arg in ("--overlay-src", str(layer))
        ]
        upper, work = overlay
        argv = [config.bwrap, *sources, "--overlay", str(upper), str(work), "/", *proc]
    elif config.layers:  # an image: its writable overlay, mounted by overlay_argv, is the root
        argv = [config.bwrap, "--bind", str(config.rootfs), "/", *proc]
    else:
        argv = [config.bwrap, *_top_level(config.rootfs, config.host_view), *proc]
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


def _namespaces_argv(config: JailConfig, root_namespace: bool = False) -> list[str]:
    argv = [] if config.layers else ["--remount-ro", "/"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if config.hostname:
        argv += ["--hostname", config.hostname]
    if not config.network:
        argv.append("--unshare-net")
    if config.user is not None:
        argv += ["--unshare-user", "--uid", str(config.user[0]), "--gid", str(config.user[1])]
    elif root_namespace:  # root in the jail, as in overlay_argv's user namespace
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
    return [*argv, "--die-with-parent", "--new-session", "--as-pid-1"]
