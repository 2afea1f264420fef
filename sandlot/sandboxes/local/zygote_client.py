"""The host side of zygotes (:mod:`sandlot.sandboxes.local.zygote`): one per jail shape and
thread, started on first use, kept while idle (up to :data:`IDLE_ZYGOTES` per thread), asked
to fork each sandbox's init.

A zygote is tied to the thread that started it: ``bwrap --die-with-parent`` follows that
thread, so one that exits takes its zygotes, and their sandboxes, with it (a sandbox made by
its own ``bwrap`` is tied to its thread the same way). A zygote that died is replaced on the
next use; the sandboxes it had are dead (:class:`InitDied` on their next request). One whose
sandbox was not ready within the budget (30 s) is retired: the next sandbox gets a new
zygote, and the old one is stopped when its last sandbox closes.

The sandbox's init pid on the host comes with its first message: the socket pair has
``SO_PASSCRED`` set, so the kernel attaches the sender's pid, translated into our PID
namespace (``unix(7)``, ``SCM_CREDENTIALS``). A pidfd (``pidfd_open(2)``) then signals that
process and no other, even after its pid is reused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import marshal
import os
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import anyio.lowlevel

from sandlot.sandboxes.local.init_client import (
    INIT_SOURCE,
    InitProcess,
    SpawnedProcess,
    check_ready,
    spawn,
)
from sandlot.sandboxes.local.interpreter import interpreter_prefixes
from sandlot.sandboxes.local.jail import (
    _OVERLAY_OPTIONS_MAX,
    PROC_MASKED,
    JailConfig,
    keyring_filter,
    zygote_jail,
)
from sandlot.sandboxes.local.peer import InitDied, Peer

log = logging.getLogger("sandlot.sandboxes.local")

IDLE_ZYGOTES = 4
"""Zygotes with no open sandbox kept per thread (each about 10 MB); the least recently used
beyond that are stopped."""

_SOURCE = (Path(__file__).parent / "zygote.py").read_text().partition('"""\n\n')[2]
# zygote.SANDBOXES, zygote.KEEP and zygote.LAYERS (that file is not imported here)
_SANDBOXES = "/sandlot/.sandboxes"
_KEEP = "/sandlot/.keep"
_LAYERS = "/sandlot/.layers"
_SANDBOXES_FROM_LAYERS = os.path.relpath(_SANDBOXES, _LAYERS)  # a child names lowers from there
_LOADER = "import marshal;INIT,CODE=marshal.loads(open(0,'rb',closefd=False).read());exec(CODE)"
_READY_BUDGET_S = 30.0
_REAP_BUDGET_S = 5.0
_REAP_YIELDS = 100  # an exited init is reaped by its zygote within microseconds
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid


@functools.cache
def _compiled() -> bytes:
    init = compile(INIT_SOURCE, "sandlot-init", "exec")
    return marshal.dumps((init, compile(_SOURCE, "sandlot-zygote", "exec")))


class ForkedProcess:
    """A sandbox's init forked by a zygote, as a :class:`~.init_client.HostProcess`.

    Args:
        pid: its pid on the host.

    Raises:
        ProcessLookupError: it is already gone.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)
        try:
            # Its /proc directory: gone once the zygote reaped it, even if the pid is reused.
            self._proc: int | None = os.open(f"/proc/{pid}", os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            os.close(self._pidfd)
            raise ProcessLookupError(pid) from exc

    def poll(self) -> int | None:
        """``None`` until it has exited and its zygote has reaped it."""
        if self._proc is None:
            return 0
        try:
            os.stat("stat", dir_fd=self._proc)
            return None
        except OSError:
            os.close(self._proc)
            os.close(self._pidfd)
            self._proc = None
            return 0

    def kill(self) -> None:
        """SIGKILL it: the kernel then kills every process of its PID namespace."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self, within_s: float) -> None:
        """Return once its zygote has reaped it, or after ``within_s`` seconds.

        The pidfd turns readable when it exits, which for the PID 1 of a namespace is after
        every other process in it is gone; its zygote reaps it at once.
        """
        with anyio.move_on_after(within_s):
            if self._proc is not None:
                await anyio.wait_readable(self._pidfd)
            for _ in range(_REAP_YIELDS):
                if self.poll() is not None:
                    return
                await anyio.lowlevel.checkpoint()
            while self.poll() is None:  # noqa: ASYNC110 (not our child: no waitpid)
                await anyio.sleep(0.001)


class Zygote:
    """A running zygote. Use :func:`acquire`.

    Attributes:
        users: its open sandboxes.
        last_used: :func:`time.monotonic` when its last sandbox closed.
        retired: it makes no more sandboxes (one it made was not ready in time); it is stopped
            once its last sandbox closes.
    """

    def __init__(self, process: SpawnedProcess, sock: socket.socket) -> None:
        self.process = process
        self._peer = Peer(sock, process, "the zygote")
        self.users = 0
        self.last_used = time.monotonic()
        self.retired = False

    @classmethod
    async def start(cls, config: JailConfig, python: str) -> Zygote:
        """Start the zygote of sandboxes shaped ``config``, its code run by ``python`` (this
        process's own base interpreter: it loads code compiled here).

        Raises:
            InitDied: bwrap or the zygote exited before it was ready; the message holds its
                stderr.
            OSError: bwrap could not be spawned.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        jail = zygote_jail(config, _SANDBOXES, _KEEP, _LAYERS)
        own_net, overlay = not config.network, config.environment is not None
        images = config.layer_store is not None
        argv = [*jail.argv, "--", python, "-I", "-S", "-c", _LOADER, str(theirs.fileno())]
        argv += ["01"[own_net], config.workdir, "01"[overlay], "01"[images]]
        argv += [",".join(sorted(PROC_MASKED))]
        argv += [(keyring_filter() or b"").hex(), *jail.kept]
        # Unnamed (O_TMPFILE): nothing to remove when a zygote dies with its thread.
        log_file = tempfile.TemporaryFile(dir=config.sandboxes_dir)  # noqa: SIM115 (closed below)
        try:
            env = {"LANG": "C.UTF-8"}
            squashfuse = shutil.which("squashfuse") if images else None
            if squashfuse:  # it mounts the layer images named in requests (zygote.py)
                env["SANDLOT_SQUASHFUSE"] = squashfuse
            popen = spawn(argv, env, None, (theirs.fileno(),), log_file, _compiled())
        except BaseException:
            ours.close()
            log_file.close()
            raise
        finally:
            theirs.close()
        zygote = cls(SpawnedProcess(popen), ours)
        try:
            with anyio.fail_after(_READY_BUDGET_S):
                check_ready(await zygote._peer.receive())
        except BaseException as exc:
            await zygote.stop()
            if isinstance(exc, (InitDied, TimeoutError)):
                log_file.seek(0)
                detail = log_file.read().decode("utf-8", "replace").strip()[-2000:]
                raise InitDied(f"the zygote did not start: {exc}: {detail}") from exc
            raise
        finally:
            log_file.close()
        return zygote

    @property
    def alive(self) -> bool:
        """``True`` until its connection broke or its process exited."""
        return self._peer.alive

    async def fork(self, fields: list[bytes], fds: list[int]) -> None:
        """Ask for a sandbox: an ``N`` request (see the zygote's protocol) with ``fds``.

        Raises:
            InitDied: the zygote is gone.
        """
        await self._peer.send([b"N", *fields], fds)

    async def stop(self) -> None:
        """Kill the zygote and every sandbox it made, and reap it. Never raises."""
        with anyio.CancelScope(shield=True):
            self.process.kill()
            self._peer.close()
            deadline = time.monotonic() + _REAP_BUDGET_S
            while self.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await anyio.sleep(0.001)


@dataclass
class _Entry:
    zygote: Zygote | None = None
    starting: anyio.Event | None = None
    refused: str | None = None


class _Registry(threading.local):
    """This thread's zygotes, by shape; a forked child of ours starts with none (its parent's
    are not its own to use or stop)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.by_shape: dict[JailConfig, _Entry] = {}

    def entries(self) -> dict[JailConfig, _Entry]:
        if self.owner != os.getpid():
            self.owner, self.by_shape = os.getpid(), {}
        return self.by_shape


_registry = _Registry()


async def acquire(config: JailConfig, python: str) -> Zygote | None:
    """The zygote of sandboxes shaped ``config`` in this thread, started when needed; ``None``
    when zygotes cannot run here (logged once per shape: sandboxes then get their own bwrap).
    Pair with :func:`release`."""
    while True:
        entry = _registry.entries().setdefault(config, _Entry())
        if entry.refused is not None:
            return None
        if entry.starting is not None:
            await entry.starting.wait()
            continue
        if entry.zygote is not None and entry.zygote.alive and not entry.zygote.retired:
            entry.zygote.users += 1
            return entry.zygote
        break
    entry.starting = anyio.Event()
    try:
        old, entry.zygote = entry.zygote, None
        if old is not None and (not old.alive or old.users == 0):
            await old.stop()  # else retired, stopped by the release of its last sandbox
        try:
            entry.zygote = await Zygote.start(config, python)
        except (InitDied, OSError) as exc:
            entry.refused = str(exc)
            log.warning(
                "no zygote for jails with workdir %s in this thread, so each of them gets its "
                "own bwrap (about 3x slower to open): %s",
                config.workdir,
                exc,
            )
            return None
        entry.zygote.users += 1
        return entry.zygote
    finally:
        entry.starting.set()
        entry.starting = None


async def release(config: JailConfig, zygote: Zygote) -> None:
    """One sandbox of ``zygote`` is closed. Stops ``zygote`` if it was retired and this was its
    last sandbox, and the least recently used idle zygotes of this thread beyond
    :data:`IDLE_ZYGOTES`. Never raises."""
    zygote.users -= 1
    zygote.last_used = time.monotonic()
    entries = _registry.entries()
    if entries.get(config, _Entry()).zygote is not zygote:
        if zygote.users == 0:
            await zygote.stop()  # retired, or dead and replaced
        return
    idle = [
        (e.zygote.last_used, shape)
        for shape, e in entries.items()
        if e.zygote is not None and e.zygote.users == 0 and e.starting is None
    ]
    idle.sort(key=lambda item: item[0])
    for _, shape in idle[: max(0, len(idle) - IDLE_ZYGOTES)]:
        stopped = entries.pop(shape).zygote
        assert stopped is not None
        await stopped.stop()


def image_request(config: JailConfig) -> tuple[JailConfig, tuple[bytes, ...]] | None:
    """The zygote shape and the ``uid gid lower...`` fields of the request (see the zygote's
    protocol) of the sandbox of a container image jailed by ``config`` (``config.layers``
    set); ``None`` when a zygote cannot make it (a layer neither in the image cache's layer
    directory nor a snapshot's ``upper`` among the sandboxes, or mount options beyond a page).

    One zygote serves every image of a shape (workdir, network, ...): it runs this machine's
    interpreter on the host's files, and its child mounts the image named in the request, so
    the first sandbox of a newly pulled image finds a zygote too.
    """
    assert config.sandboxes_dir is not None and config.layers
    store = config.layers[-1].parent
    lowers: list[str] = []
    for layer in config.layers:
        if layer.parent == store:
            lowers.append(layer.name)
        elif layer.parent.parent == config.sandboxes_dir:  # a snapshot's frozen layer
            lowers.append(f"{_SANDBOXES_FROM_LAYERS}/{layer.parent.name}/{layer.name}")
        else:
            return None
    # upperdir and workdir: under the sandbox's directory, named by its id (a uuid).
    if sum(len(lower) + 1 for lower in lowers) + 2 * (len(_SANDBOXES) + 64) > _OVERLAY_OPTIONS_MAX:
        return None
    shape = replace(
        config,
        rootfs=Path("/"),
        host_view="minimal",
        readonly=interpreter_prefixes(),
        layers=(),
        user=None,
        layer_store=store,
        hostname=None,  # each child reads its own (zygote.HOSTNAME)
    )
    ids = [b"", b""] if config.user is None else [str(i).encode() for i in config.user]
    return shape, (*ids, *(lower.encode() for lower in lowers))


async def fork_init(
    zygote: Zygote,
    *,
    name: str,
    limits: str,
    cgroup_joins: list[str],
    prefix: str,
    request: tuple[bytes, ...] = (),
) -> InitProcess:
    """Have ``zygote`` fork the init of a sandbox whose directory is ``name`` (under the
    sandboxes' directory), in its cgroups, and return it once ready.

    Args:
        zygote: from :func:`acquire`.
        name: the sandbox directory's name.
        limits: ``LIMITS`` of the init's protocol.
        cgroup_joins: host paths of the files of the sandbox's cgroups the init writes ``0``
            to, before it runs anything, to join them (see ``Cgroup.join_file``).
        prefix: command ids' prefix (see :class:`InitProcess`).
        request: the request's further fields (:func:`image_request`'s for an image).

    Raises:
        InitDied: the zygote is gone, or a cgroup, the jail or the init failed (the message
            says why).
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    ours.setblocking(False)
    fds = [theirs.fileno()]
    process: ForkedProcess | None = None
    try:
        try:
            for path in cgroup_joins:
                fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
            await zygote.fork([os.fsencode(name), limits.encode(), *request], fds)
        except OSError as exc:
            raise InitDied(f"cannot put the sandbox's init in its cgroup: {exc}") from exc
        finally:
            theirs.close()
            for fd in fds[1:]:
                os.close(fd)
        with anyio.fail_after(_READY_BUDGET_S):
            pid = await _ready_pid(ours)
        try:
            process = ForkedProcess(pid)
        except ProcessLookupError as exc:
            raise InitDied("the sandbox's init exited as it started") from exc
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
    except BaseException as exc:
        if process is not None:
            process.kill()
        ours.close()
        if isinstance(exc, TimeoutError):
            zygote.retired = True  # stuck: the next sandbox gets a new zygote
            raise InitDied(f"the sandbox's init was not ready in {_READY_BUDGET_S:g} s") from exc
        raise
    return InitProcess(process, ours, prefix, jailed=True)


async def _ready_pid(sock: socket.socket) -> int:
    """Wait for the init's ``R`` and return the host pid the kernel attached to it.

    Raises:
        InitDied: it said something else (``E``: why its jail failed) or exited.
    """
    while True:
        try:
            data, ancdata, _, _ = sock.recvmsg(1024, socket.CMSG_SPACE(_CREDENTIALS.size))
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        except OSError:
            data, ancdata = b"", []
        if not data:
            raise InitDied("the sandbox's init exited before it was ready")
        check_ready(data.split(b"\0"))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                return int(_CREDENTIALS.unpack(payload[: _CREDENTIALS.size])[0])
        raise InitDied("the sandbox's init said it is ready without credentials")
