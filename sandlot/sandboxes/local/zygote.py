"""The zygote of ``local`` sandboxes: one long-lived process that forks each sandbox's init.

Starting a jail costs a ``bwrap`` (mounts copied, namespaces made) and a Python interpreter
(about 9 ms on 2 cores): more than the rest of a sandbox's life in an RL rollout that opens one
per step. A zygote pays both once per jail shape (image, workdir, network, environment,
masks). Each sandbox is then a forked child that enters new namespaces, mounts the sandbox's
own directories, drops every capability and becomes the sandbox's init
(:mod:`sandlot.sandboxes.local.init`, already loaded) as PID 1 of its own PID namespace.
Linux namespaces nest, so a sandbox made here is the same jail as one made by its own bwrap
(:mod:`sandlot.sandboxes.local.jail`).

The zygote keeps one such child ready, its namespaces made, waiting for a sandbox to serve
(Android's zygote keeps such a pool of "unspecialized" processes for the same reason): a
request then costs a few mounts, and the fork of the next spare happens after the reply.

This file is a standalone script (standard library only), run as
``python -I -S -c LOADER FD OWN_NET WORKDIR OVERLAY IMAGES MASKED FILTER KEPT...`` as PID 1 of
a jail whose ``bwrap`` keeps its capabilities (it never runs a command itself), with the
sandboxes' directory bound at :data:`SANDBOXES` and ``INIT`` (the init's code object) in its
globals. ``OWN_NET`` (a network namespace per sandbox), ``OVERLAY`` (bind
``/sandlot/overlay``) and ``IMAGES`` (it makes sandboxes of container images, whose layers
are bound at :data:`LAYERS`; see below) are ``1`` or ``0``; ``MASKED`` the names of the
``/proc`` entries to cover, joined by commas (:data:`sandlot.sandboxes.local.jail.PROC_MASKED`);
``FILTER`` the seccomp filter in hex, empty for none
(:func:`sandlot.sandboxes.local.jail.keyring_filter`); ``KEPT[i]`` is where the read-only bind
at ``KEEP/i`` goes once the child's own directories cover its parent (an environment under
``/tmp``; see :func:`sandlot.sandboxes.local.jail.zygote_jail`).

Protocol, over the ``AF_UNIX``/``SOCK_SEQPACKET`` socket at file descriptor ``FD`` (one packet
per message, fields separated by NUL bytes):

* zygote -> host: ``R`` once ready, or ``E message`` when it cannot make sandboxes here;
* host -> zygote: ``N name limits`` (with ``IMAGES``: ``N name limits uid gid lower...``)
  with file descriptors attached (``SCM_RIGHTS``): the init's end of the new sandbox's socket
  pair, then the ``cgroup.procs`` files (open for writing) the sandbox joins. ``name`` is the
  sandbox's directory under :data:`SANDBOXES`, ``limits`` the init's ``LIMITS``; ``uid`` and
  ``gid`` the image's ``User`` (empty: root), each ``lower`` a layer of the image, topmost
  first, relative to :data:`LAYERS` (a fork's snapshot layer lies under :data:`SANDBOXES`).
  The child speaks the init's protocol on that socket; when it cannot be made it sends
  ``E message`` there instead and exits.

A spare child, before it is asked (``mount(2)``, ``unshare(2)``), makes itself undumpable
(``init.prepare``), then:

1. is PID 1 of a new PID namespace (``unshare(CLONE_NEWPID)`` before the fork, then ``setns``
   back, so the next spare gets its own); enters new mount, IPC, UTS (and, with ``OWN_NET``,
   network) namespaces;
2. mounts a fresh ``/proc`` (every top-level entry but the PID directories and the symlinks
   into them read-only, ``MASKED`` ones and its own ``fd`` directories covered, as
   :mod:`sandlot.sandboxes.local.jail` describes), a private ``/dev/shm``, ``/dev/pts`` and
   ``/run``, and makes ``/dev`` read-only, since every child shares the zygote's; brings
   loopback up in its own network namespace;
3. empties its capability bounding set (``capabilities(7)``): nothing it runs can gain one;
   loads ``FILTER`` (``seccomp(2)``), inherited by everything it runs.

Once asked, for sandbox ``name``:

4. joins the sandbox's cgroups;
5. binds its own ``tmp``, ``home``, ``work`` (and ``overlay``) on ``/tmp``, ``$HOME``, the
   workdir (and ``/sandlot/overlay``); for a fork of a snapshot, whose directory holds the
   symlink :data:`LOWER` to the snapshot's workdir, the workdir is instead an overlayfs of
   that under its own ``upper``; binds back ``KEPT``, then detaches :data:`SANDBOXES` and
   ``KEEP``, so no child sees another's files;
6. where the zygote's uid 0 is not the host's root (a caller who is not root: bwrap gave the
   zygote a user namespace), enters a user namespace of its own, root in it too, so that
   ``RLIMIT_NPROC`` counts each sandbox's processes apart rather than all of the zygote's;
   drops every capability it holds, sets no new privileges, starts a new session, and runs
   the init.

With ``IMAGES``, the zygote's own root is the host's (its interpreter runs the init's code,
loaded once, in every child), and step 5 instead builds the sandbox's root as its own bwrap
would (:func:`sandlot.sandboxes.local.jail.jail_argv`): an overlayfs of the image's layers
under the sandbox's ``upper``, mounted on its ``rootfs`` directory; the ``/proc``, ``/dev``
and ``/run`` of steps 2-3 moved into it; ``tmp`` and ``home`` bound on ``/tmp`` and
``$HOME``; the workdir made; the hostname set (from the sandbox's :data:`HOSTNAME` file); then
``pivot_root(2)`` into it and the old root detached, so
the host's files, the layers and the other sandboxes are gone from the child's view. A
non-root ``User`` (or, as in step 6, root for a caller who is not root) then gets a user
namespace of its own that maps it to root outside it (what ``bwrap --unshare-user --uid``
does), and the bounding set is emptied again (a new user namespace fills it). The init's
code needs nothing from the host's files after the pivot: its modules are loaded before the
fork.
"""

import _socket
import ctypes
import gc
import os
import sys

# os.execvpe (how the init runs a command under limits) imports warnings on its first call:
# imported here, as an image's child has the host's files out of reach once it pivots.
import warnings  # noqa: F401

SANDBOXES = "/sandlot/.sandboxes"
LOWER = "lower"
KEEP = "/sandlot/.keep"
LAYERS = "/sandlot/.layers"
MOUNTS = "/sandlot/.mounts"
HOSTNAME = "hostname"
"""In a sandbox of an image's directory: its hostname, written by the host
(:mod:`sandlot.sandboxes.local.runtime_files`)."""
_ROOTFS = "rootfs"
_MOVED = ("/proc", "/dev", "/run")
# pivot_root(2) has no glibc wrapper: its number per machine (asm/unistd_64.h, generic).
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MAX_SYMLINKS = 40  # as the kernel's path walk
_HOME = "/sandlot/home"
_OVERLAY = "/sandlot/overlay"

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE = 4
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024 | 2048  # and MS_NODIRATIME
_MS_RELATIME = 1 << 21
_ST_RELATIME = 4096
_MS_BIND = 4096
_MS_MOVE = 8192
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 1

# own network namespace, workdir, overlay, images, masked /proc entries, seccomp filter, kept
# (see the module docstring)
_Shape = tuple[bool, str, bool, bool, frozenset[str], bytes, list[str]]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)  # fmt: skip


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    _check(_libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data or None)),
           f"mount {target}")  # fmt: skip


def _bind(source: str, target: str, readonly: bool = False) -> None:
    if not os.path.lexists(target):
        # Below a writable mount already in place (a workdir or an environment under /tmp).
        if os.path.isdir(source):
            os.makedirs(target)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    _mount(source, target, None, _MS_BIND | _MS_REC)
    if readonly:
        _remount_readonly(target)


def _remount_readonly(target: str) -> None:
    # A bind remount must repeat the flags the mount has (statvfs(3) ST_* bits, equal to
    # the MS_* ones up to ST_NODIRATIME), or the kernel may refuse to clear them.
    current = os.statvfs(target).f_flag
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    flags |= current & (_MS_NOEXEC | _MS_NOATIME) | (_MS_RELATIME if current & _ST_RELATIME else 0)
    _mount(None, target, None, flags)


def _loopback_up() -> None:
    """``ip link set lo up`` (``SIOCSIFFLAGS`` on a ``struct ifreq``), as bwrap does."""
    import fcntl

    request = b"lo".ljust(16, b"\0") + _IFF_UP.to_bytes(2, sys.byteorder)
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request.ljust(40, b"\0"))
    finally:
        sock.close()


def _empty_bounding_set() -> None:
    """No capability can be gained again, even by executing a setuid program as root; the
    capabilities held now stay (until :func:`_drop_capabilities`)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping the bounding set")


def _drop_capabilities() -> None:
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient set")
    header = (_LINUX_CAPABILITY_VERSION_3).to_bytes(4, sys.byteorder) + bytes(4)
    _check(_libc.capset(header, bytes(24)), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _cover_proc(masked: frozenset[str]) -> None:
    """Make every top-level entry of the fresh ``/proc`` that describes the machine rather
    than a process (all but the PID directories and the symlinks into them) read-only, or
    cover it when ``masked``: an empty read-only tmpfs, or ``/dev/null``. The same rule as
    :func:`sandlot.sandboxes.local.jail.proc_covered`, applied to the jail's own procfs."""
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    with os.scandir("/proc") as entries:
        found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries
                 if not e.name.isdigit() and not e.is_symlink()]  # fmt: skip
    for name, is_dir in found:
        path = "/proc/" + name
        if name in masked and is_dir:
            _mount("tmpfs", path, "tmpfs", flags | _MS_RDONLY, "mode=0555")
            continue
        # A fresh procfs has nothing mounted below: no MS_REC, and its flags are known.
        _mount("/dev/null" if name in masked else path, path, None, _MS_BIND)
        _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
    # We are PID 1 of this procfs, and the init: see jail.INIT_FDS.
    _mount("tmpfs", "/proc/1/fd", "tmpfs", flags | _MS_RDONLY, "mode=0500")
    _mount("/proc/1/fd", "/proc/1/task/1/fd", None, _MS_BIND)


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))  # struct sock_fprog


def _install_filter(program: bytes) -> None:
    """Load the seccomp filter ``program`` (``struct sock_filter`` array); we still hold
    ``CAP_SYS_ADMIN``, so no ``no_new_privs`` is needed yet."""
    fprog = _Program(len(program) // 8, program)
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
           "seccomp")  # fmt: skip


def _prepare(own_net: bool, masked: frozenset[str], program: bytes) -> None:
    """Steps 1 to 3 of the module docstring (the PID namespace is the zygote's doing)."""
    namespaces = _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS | (_CLONE_NEWNET if own_net else 0)
    _check(_libc.unshare(namespaces), "unshare")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _cover_proc(masked)
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
           "newinstance,ptmxmode=0666,mode=620")  # fmt: skip
    if os.path.exists("/dev/fuse"):  # the zygote's, for its layer mounts: not a sandbox's
        _check(_libc.umount2(b"/dev/fuse", _MNT_DETACH), "umount /dev/fuse")
    _remount_readonly("/dev")
    _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    if own_net:
        _loopback_up()
    _empty_bounding_set()
    if program:
        _install_filter(program)


def _join(cgroups: list[int]) -> None:
    for fd in cgroups:
        try:
            os.write(fd, b"0")  # 0: the writer
        except OSError as exc:
            raise OSError(f"cannot put the sandbox's init in its cgroup: {exc}") from exc
        os.close(fd)


def _shares_user_with_host_root() -> bool:
    """Whether our uid 0 is the host's root: ``False`` in the user namespace bwrap makes for
    a caller who is not root, where uid 0 is that caller outside."""
    with open("/proc/self/uid_map") as f:
        return any(line.split()[:2] == ["0", "0"] for line in f)


# RLIMIT_NPROC counts the processes of a uid per user namespace (Linux 5.14, ucounts), and
# holds for every uid but the host's root: where uid 0 is someone else, every sandbox of this
# zygote would share one count, so each gets a user namespace of its own (see _map_user).
_OWN_USER_NAMESPACE = not _shares_user_with_host_root()


def _serve_sandbox(
    name: str, workdir: str, overlay: bool, kept: list[str], cgroups: list[int]
) -> None:
    """Steps 4 to 6 of the module docstring, up to running the init."""
    _join(cgroups)
    own = f"{SANDBOXES}/{name}"
    _bind(f"{own}/tmp", "/tmp")
    _bind(f"{own}/home", _HOME)
    if os.path.islink(f"{own}/{LOWER}"):  # a fork: its workdir stacks a snapshot's (freeze.py)
        layers = f"lowerdir={own}/{LOWER},upperdir={own}/upper,workdir={own}/overlay-work"
        _mount("overlay", workdir, "overlay", 0, f"userxattr,{layers}")
    else:
        _bind(f"{own}/work", workdir)
    if overlay:
        _bind(f"{own}/overlay", _OVERLAY)
    for i, dest in enumerate(kept):
        _bind(f"{KEEP}/{i}", dest, readonly=True)
        _check(_libc.umount2(f"{KEEP}/{i}".encode(), _MNT_DETACH), f"umount {KEEP}/{i}")
    _check(_libc.umount2(SANDBOXES.encode(), _MNT_DETACH), f"umount {SANDBOXES}")
    os.chdir(workdir)
    if _OWN_USER_NAMESPACE:
        _map_user(0, 0)
    _drop_capabilities()
    os.setsid()


def _inside(root: str, path: str) -> str:
    """Where ``path`` (absolute, in the image) is under ``root``, its symlinks followed as
    they would be with ``root`` as ``/`` (this process's own root is still the host's, where
    an image's link would lead elsewhere); each missing directory on the way made (mode
    0755, as bwrap's ``--dir``).

    Raises:
        OSError: a directory cannot be made, or too many links (``ELOOP``).
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []  # resolved, each a directory
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done[:-1]
            continue
        current = "/".join([root, *done, part])
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            if os.path.islink(current):
                links += 1
                if links > _MAX_SYMLINKS:
                    raise OSError(40, f"too many levels of symbolic links: {path}") from None
                target = os.readlink(current)
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
        done.append(part)
    return "/".join([root, *done])


def _map_user(uid: int, gid: int) -> None:
    """Run as ``uid``:``gid`` in a user namespace of our own where that id is who root is
    outside it (``bwrap --unshare-user --uid --gid``); empty the bounding set the new
    namespace filled, and stay undumpable."""
    _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{gid} 0 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(line)
    _empty_bounding_set()
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def _set_hostname(path: str) -> None:
    """Our UTS namespace's hostname: the first line of the host's file at ``path`` (absent:
    keep the zygote's). Before any user namespace of the sandbox's own: ours owns the UTS
    namespace the spare made."""
    try:
        with open(path, "rb") as f:
            name = f.readline(65).strip()
    except FileNotFoundError:
        return
    _check(_libc.sethostname(name, len(name)), "sethostname")


def _serve_image(name: str, workdir: str, request: list[bytes], cgroups: list[int]) -> None:
    """Steps 4 to 6 of the module docstring with ``IMAGES``, up to running the init.
    ``request``: the ``uid gid lower...`` fields of the ``N`` request."""
    _join(cgroups)
    own = f"{SANDBOXES}/{name}"
    root = f"{own}/{_ROOTFS}"
    uid, gid, lowers = request[0], request[1], b":".join(request[2:]).decode()
    _set_hostname(f"{own}/{HOSTNAME}")
    os.chdir(LAYERS)  # the lowers are named relative to it: mount options hold one page
    options = f"userxattr,lowerdir={lowers},upperdir={own}/upper,workdir={own}/overlay-work"
    _mount("overlay", root, "overlay", _MS_NOSUID | _MS_NODEV, options)
    for path in _MOVED:
        _mount(path, _inside(root, path), None, _MS_MOVE)
    _bind(f"{own}/tmp", _inside(root, "/tmp"))
    _bind(f"{own}/home", _inside(root, _HOME))
    _inside(root, workdir)
    os.chdir(root)
    _check(_libc.syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "umount the old root")
    if uid or _OWN_USER_NAMESPACE:
        _map_user(int(uid or 0), int(gid or 0))
    os.chdir(workdir)
    _drop_capabilities()
    os.setsid()


def _probe_images() -> None:
    """Fail now, so that the host gives each sandbox its own bwrap, where this kernel does
    not let us mount an overlayfs of the layers (or has no pivot_root number here).

    Raises:
        OSError: why.
    """
    if os.uname().machine not in _SYS_PIVOT_ROOT:
        raise OSError(f"no pivot_root(2) number for {os.uname().machine}")
    _mount("overlay", "/tmp", "overlay", _MS_RDONLY, f"userxattr,lowerdir={LAYERS}:/run")
    _check(_libc.umount2(b"/tmp", _MNT_DETACH), "umount /tmp")


def _refuse(fd: int, message: str) -> None:
    try:  # noqa: SIM105 (contextlib costs an import)
        os.write(fd, b"E\0" + message.encode(errors="replace"))
    except OSError:
        pass


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    return [
        int.from_bytes(payload[i : i + 4], sys.byteorder)
        for level, kind, payload in ancdata
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
        for i in range(0, len(payload) - 3, 4)
    ]


# The init's functions, defined (and its modules imported) once, before any fork.
_INIT: dict[str, object] = {"__name__": "sandlot_init"}
exec(INIT, _INIT)  # type: ignore[name-defined]  # noqa: F821 (set by the loader)
# Every object so far lives on in each child: the collector must not touch (and so copy)
# their pages there.
gc.freeze()


def _spare(sock: _socket.socket, shape: _Shape, inherited: list[int]) -> None:
    """A forked spare: prepare, say so on ``sock``, wait for a sandbox, serve it, exit."""
    own_net, workdir, overlay, images, masked, program, kept = shape
    try:
        wake_r = _INIT["prepare"]()[0]  # type: ignore[operator]  # replaces the zygote's pipe
        for fd in inherited:
            os.close(fd)
        # The zygote's stdin and stderr (its log) are the same files in every child: a
        # command could reach them through /proc/1/fd and talk to another sandbox.
        null = os.open("/dev/null", os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.close(null)
        _prepare(own_net, masked, program)
    except BaseException as exc:  # reported, whatever it is
        sock.send(b"E\0" + f"cannot set up the sandbox's jail: {exc}".encode(errors="replace"))
        os._exit(1)
    sock.send(b"R")
    try:
        data, ancdata, _, _ = sock.recvmsg(1 << 16, _socket.CMSG_SPACE(16 * 4))
    except OSError:
        os._exit(0)
    sock.close()  # the zygote's end is closed already; the init keeps no way back to it
    fds = _received_fds(ancdata)
    if not data or not fds:
        os._exit(0)  # the zygote is gone
    fields = data.split(b"\0")
    try:
        if images:
            _serve_image(os.fsdecode(fields[1]), workdir, fields[3:], fds[1:])
        else:
            _serve_sandbox(os.fsdecode(fields[1]), workdir, overlay, kept, fds[1:])
    except BaseException as exc:  # reported, whatever it is
        _refuse(fds[0], f"cannot set up the sandbox's jail: {exc}")
        os._exit(1)
    try:
        _INIT["main"](fds[0], os.fsdecode(fields[2]), wake_r)  # type: ignore[operator]
    finally:
        os._exit(0)


class _Zygote:
    def __init__(self, fd: int, shape: _Shape) -> None:
        self.control = _socket.socket(fileno=fd)
        self.shape = shape
        self.own_pids = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.wake_r, self.wake_w = _INIT["prepare"]()  # type: ignore[operator]
        self.spare: _socket.socket | None = None
        self.spare_ready = False
        self.mounted: set[str] = set()  # layer images mounted under MOUNTS

    def fork_spare(self) -> None:
        """Fork the next spare (PID 1 of a new PID namespace); keep our end of its socket.

        Raises:
            OSError: no fork (e.g. the process cap).
        """
        # setns back first: a second unshare(CLONE_NEWPID) fails until then.
        _check(_libc.setns(self.own_pids, _CLONE_NEWPID), "setns")
        _check(_libc.unshare(_CLONE_NEWPID), "unshare")
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        inherited = [self.control.fileno(), self.own_pids, self.wake_r, self.wake_w, ours.fileno()]
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            _spare(theirs, self.shape, inherited)
        theirs.close()
        self.spare, self.spare_ready = ours, False

    def ready_spare(self) -> _socket.socket:
        """The spare, forked now if there is none, once it says it is prepared.

        Raises:
            OSError: it could not be forked or prepared (the message says why).
        """
        if self.spare is None:
            self.fork_spare()
        spare = self.spare
        assert spare is not None
        if not self.spare_ready:
            status = spare.recv(1 << 16).split(b"\0")
            if status != [b"R"]:
                spare.close()
                self.spare = None
                raise OSError(b" ".join(status[1:]).decode(errors="replace") or "the spare died")
            self.spare_ready = True
        return spare

    def serve(self, fields: list[bytes], fds: list[int]) -> None:
        """Hand the sandbox of an ``N`` request to the spare (closing our copies of ``fds``:
        the next spare must not hold them), then fork the next spare. With ``IMAGES``, the
        request's layer images are mounted first (see :meth:`mount_layers`)."""
        try:
            if self.shape[3] and self.mount_layers(fields) and self.spare is not None:
                # Its mount namespace was copied before these mounts: a new spare sees them.
                self.spare.close()
                self.spare = None
            spare = self.ready_spare()
            self.spare = None
            payload = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
            try:
                spare.sendmsg(
                    [b"\0".join(fields)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, payload)]
                )
            finally:
                spare.close()
        except OSError as exc:
            _refuse(fds[0], f"the zygote could not make the sandbox's jail: {exc}")
        for fd in fds:
            os.close(fd)
        try:  # noqa: SIM105 (contextlib costs an import)
            self.fork_spare()
        except OSError:
            pass  # the next request forks (or reports why it cannot)

    def mount_layers(self, fields: list[bytes]) -> bool:
        """Mount each layer image (``HEX.sqfs``) among the lowers of request ``fields`` with
        ``squashfuse`` under :data:`MOUNTS`, once per zygote, and name its mount point in the
        request instead (relative to :data:`LAYERS`); whether any was mounted now. The FUSE
        daemons are processes of our PID namespace: they die with us.

        Raises:
            OSError: ``squashfuse`` is missing or failed.
        """
        fresh = False
        for i in range(5, len(fields)):
            name = os.fsdecode(fields[i])
            if not name.endswith(".sqfs") or "/" in name:
                continue
            target = f"{MOUNTS}/{name[:-5]}"
            if name not in self.mounted:
                tool = os.environ.get("SANDLOT_SQUASHFUSE")
                if not tool:
                    raise OSError("squashfuse is not installed (SANDLOT_IMAGE_LAYERS=unpack)")
                os.makedirs(target, exist_ok=True)
                # Our children go to our own PID namespace, not the next spare's: the daemon
                # would otherwise be PID 1 of one, gone when its parent exits after the mount.
                _check(_libc.setns(self.own_pids, _CLONE_NEWPID), "setns")
                argv = [tool, "-o", "ro,nosuid,nodev", f"{LAYERS}/{name}", target]
                pid = os.posix_spawn(tool, argv, {})
                _, status = os.waitpid(pid, 0)  # it daemonizes once its mount is up
                if os.waitstatus_to_exitcode(status) != 0:
                    raise OSError(f"squashfuse could not mount layer {name}")
                self.mounted.add(name)
                fresh = True
            fields[i] = os.fsencode(os.path.relpath(target, LAYERS))
        return fresh


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(fd: int, shape: _Shape) -> None:
    """Make sandboxes of ``shape`` for each request on socket
    ``fd``, until the host closes it."""
    os.set_inheritable(fd, False)
    zygote = _Zygote(fd, shape)
    try:
        if shape[3]:
            _probe_images()
        zygote.ready_spare()
    except OSError as exc:
        _refuse(fd, str(exc))
        return
    zygote.control.send(b"R")
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(zygote.wake_r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == zygote.wake_r:
                while True:
                    try:
                        if not os.read(zygote.wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                _reap()
                continue
            try:
                data, ancdata, _, _ = zygote.control.recvmsg(
                    1 << 16, _socket.CMSG_SPACE(16 * 4), _socket.MSG_CMSG_CLOEXEC
                )
            except InterruptedError:
                continue
            if not data:
                return  # the host is gone: so are we, and every sandbox with us
            fds = _received_fds(ancdata)
            if fds:
                zygote.serve(data.split(b"\0"), fds)


if __name__ == "__main__":
    fd, own_net, workdir, overlay, images, masked, program, *kept = sys.argv[1:]
    shape = (own_net == "1", workdir, overlay == "1", images == "1", frozenset(masked.split(",")))
    serve(int(fd), (*shape, bytes.fromhex(program), kept))
