"""The host side of a sandbox's init (:mod:`sandlot.sandboxes.local.init`).

:class:`InitProcess` starts the init (inside ``bwrap`` or directly), and asks it over a
``SOCK_SEQPACKET`` socket pair to spawn commands whose standard streams are file descriptors we
hand over (``SCM_RIGHTS``): the command's output flows straight into our pipes, never through
the init. The wire format is described in the init's module docstring.

Only one task reads the socket at a time (anyio allows one waiter per socket); whichever task
holds :attr:`InitProcess._reading` dispatches every message it reads to the command it names,
so concurrent commands of one sandbox wait for each other's messages at no extra cost.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import marshal
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import anyio

from sandlot.errors import SandlotError
from sandlot.sandboxes.local.peer import HostProcess, InitDied, Peer

# The init's source without its docstring: it is the init's command line, seen in /proc.
INIT_SOURCE = (Path(__file__).parent / "init.py").read_text().partition('"""\n\n')[2]
# Compiling that source costs each start more than the rest of the interpreter's start-up
# (about 5 ms on 2 cores), so our own interpreter gets the code object, compiled once, on its
# stdin instead. A code object loads only in the Python version that made it: another
# interpreter (a root filesystem's python3) gets the source.
_LOADER = "import marshal;exec(marshal.loads(open(0,'rb',closefd=False).read()))"
_READY_BUDGET_S = 30.0
_REAP_BUDGET_S = 5.0
# Without a jail, how long the init may take to kill the sandbox's processes before it is killed.
_KILL_GRACE_S = 2.0


@functools.cache
def _compiled_init() -> bytes:
    return marshal.dumps(compile(INIT_SOURCE, "sandlot-init", "exec"))


class SpawnedProcess:
    """A :class:`HostProcess` we spawned: ``bwrap`` (the leader of its session) or a bare init.

    Args:
        popen: the spawned process.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        """Its pid on the host."""
        return self.popen.pid

    def poll(self) -> int | None:
        """``None`` until it has exited; reaps it."""
        return self.popen.poll()

    def kill(self) -> None:
        """SIGKILL its whole session. Never raises."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, 9)

    async def wait(self, within_s: float) -> None:
        """Poll (no child watcher involved) until reaped, or for ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while self.popen.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.001)  # a SIGKILLed process: reaped within a tick or two


def spawn(
    argv: list[str],
    env: Mapping[str, str],
    cwd: str | Path | None,
    fds: tuple[int, ...],
    log: IO[bytes],
    code: bytes | None,
) -> subprocess.Popen[bytes]:
    """Spawn ``argv`` in a new session, ``code`` (if any) written to its stdin, stderr to
    ``log``. A fork+exec (about 1 ms): no thread hop, no asyncio child watcher.

    Raises:
        OSError: the process could not be spawned.
    """
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if code is None else subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=dict(env),
        cwd=cwd,
        pass_fds=fds,
        start_new_session=True,
    )
    if process.stdin is not None:
        # Far below a pipe's buffer: written at once, even before the init reads it.
        with contextlib.suppress(BrokenPipeError), process.stdin:
            process.stdin.write(code or b"")
    return process


def _spawn_logged(
    argv: list[str],
    env: Mapping[str, str],
    cwd: str | Path | None,
    fds: tuple[int, ...],
    log_path: Path,
    code: bytes | None,
) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return spawn(argv, env, cwd, fds, log, code)


async def _jailed_pid(info: int) -> int:
    """Host pid of the jail's PID 1, from the JSON that ``bwrap --info-fd`` writes once it has
    cloned it, then closes (``{"child-pid": N, ...}``).

    Raises:
        InitDied: bwrap exited before it made the jail.
    """
    os.set_blocking(info, False)
    data = b""
    while True:
        try:
            chunk = os.read(info, 4096)
        except BlockingIOError:
            await anyio.wait_readable(info)
            continue
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InitDied(f"bwrap did not make the jail (its info: {data[:200]!r})") from exc


def _join(cgroup_procs: Sequence[str], pid: int) -> None:
    for procs in cgroup_procs:
        with open(procs, "w") as f:
            f.write(str(pid))


def check_ready(message: list[bytes]) -> None:
    """Accept the init's first message: ``R``.

    Raises:
        InitDied: anything else (``E message``: the jail could not be made, and why).
    """
    if message[0] == b"E" and len(message) > 1:
        raise InitDied(message[1].decode("utf-8", "replace"))
    if message != [b"R"]:
        raise InitDied(f"unexpected first message {message!r}")


class SpawnFailed(SandlotError):
    """The init could not fork the command (e.g. the sandbox's process cap is reached)."""


@dataclass
class _Command:
    started: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)
    pid: int | None = None
    status: int | None = None
    duration_s: float = 0.0
    failure: str | None = None


@dataclass(frozen=True)
class Exited:
    """How a command ended: ``status`` (``128 + N`` for signal N) after ``duration_s`` seconds."""

    status: int
    duration_s: float


class InitProcess:
    """One running init and the commands it runs. Use :meth:`start`.

    Args:
        process: the init's host process (``bwrap``, the init itself without a jail, or the
            init a zygote forked).
        sock: our end of the socket pair, non-blocking.
        prefix: command ids are ``prefix.N``; also how the init finds the sandbox's processes
            without a PID namespace.
        jailed: the init is PID 1 of the sandbox's own PID namespace.
    """

    def __init__(
        self, process: HostProcess, sock: socket.socket, prefix: str, jailed: bool
    ) -> None:
        self.process = process
        self._jailed = jailed
        self._peer = Peer(sock, process, "the sandbox's init")
        self._prefix = prefix
        self._ids = itertools.count(1)
        self._commands: dict[str, _Command] = {}
        self._reading = anyio.Lock()

    @classmethod
    async def start(
        cls,
        jail: Sequence[str],
        python: str,
        *,
        our_python: bool,
        env: Mapping[str, str],
        cwd: str | Path | None,
        limits: str,
        cgroup_procs: Sequence[str],
        prefix: str,
        log_path: Path,
        seccomp: bytes | None = None,
    ) -> InitProcess:
        """Spawn ``[*jail, python, -I, -S, -c, SOURCE or LOADER, ...]`` and wait until the init
        is ready.

        Args:
            jail: the bwrap command line, ending with ``--`` (empty: no jail).
            python: the interpreter that runs the init, as seen inside the jail.
            our_python: ``python`` is this process's own (base) interpreter, which can load the
                init's code compiled here.
            env: the init's environment (commands get their own with each request).
            cwd: host working directory of the process (``None`` when bwrap sets it).
            limits: ``LIMITS`` of the init's protocol.
            cgroup_procs: host paths of the ``cgroup.procs`` files the init is put in, while it
                starts and before it runs anything.
            prefix: see the class.
            log_path: host file receiving the init's and bwrap's stderr.
            seccomp: a seccomp filter bwrap loads before it runs the init (``--seccomp``),
                with a jail.

        Raises:
            InitDied: the init (or bwrap) exited before it was ready; the message holds its
                stderr.
            OSError: the process could not be spawned.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info, info_w = os.pipe() if jail else (-1, -1)
        code = _compiled_init() if our_python else None
        # bwrap's own options go just before the final "--": the command may start with a
        # wrapper that runs bwrap (an image's overlay mount, jail.overlay_argv).
        head = [*jail[:-1], "--info-fd", str(info_w), "--"] if jail else []
        fds: tuple[int, ...] = (theirs.fileno(), info_w) if jail else (theirs.fileno(),)
        program = -1
        if jail and seccomp:
            program, program_w = os.pipe()  # far below a pipe's capacity: written at once
            os.write(program_w, seccomp)
            os.close(program_w)
            head[-1:-1] = ["--seccomp", str(program)]
            fds += (program,)
        argv = [*head, python, "-I", "-S", "-c", INIT_SOURCE if code is None else _LOADER]
        argv += [str(theirs.fileno()), limits]
        try:
            process = _spawn_logged(argv, env, cwd, fds, log_path, code)
        except BaseException:
            ours.close()
            if jail:
                os.close(info)
            raise
        finally:
            theirs.close()
            if jail:
                os.close(info_w)
            if program >= 0:
                os.close(program)
        init = cls(SpawnedProcess(process), ours, prefix, jailed=bool(jail))
        try:
            with anyio.fail_after(_READY_BUDGET_S):
                await init._ready(await _jailed_pid(info) if jail else process.pid, cgroup_procs)
        except BaseException as exc:
            await init.kill()
            if isinstance(exc, (InitDied, TimeoutError)):
                detail = (await anyio.Path(log_path).read_bytes()).decode("utf-8", "replace")
                detail = detail.strip()[-2000:]
                raise InitDied(
                    f"{exc}: {detail}" if detail else f"the init did not start: {exc!r}"
                ) from exc
            raise
        finally:
            if jail:
                os.close(info)
        return init

    async def _ready(self, pid: int, cgroup_procs: Sequence[str]) -> None:
        """Put the init (host ``pid``) in its cgroups while it starts, and wait for its ``R``.

        Raises:
            InitDied: the init exited, said something else, or could not be put in a cgroup.
        """
        # Both run to completion and keep their failure: neither error leaves as a group.
        refused: list[OSError] = []
        received: list[list[bytes] | InitDied] = []

        async def join() -> None:
            try:
                await anyio.to_thread.run_sync(_join, cgroup_procs, pid)
            except OSError as exc:
                refused.append(exc)

        async def receive() -> None:
            try:
                received.append(await self._peer.receive())
            except InitDied as exc:
                received.append(exc)

        async with anyio.create_task_group() as group:
            if cgroup_procs:
                group.start_soon(join)
            group.start_soon(receive)
        message = received[0]
        if isinstance(message, InitDied):
            raise message
        if refused:
            raise InitDied(f"cannot put the sandbox's init in its cgroup: {refused[0]}")
        check_ready(message)

    @property
    def jailed(self) -> bool:
        """The init is PID 1 of the sandbox's PID namespace: killing it kills the sandbox."""
        return self._jailed

    @property
    def alive(self) -> bool:
        """``True`` until the init's connection broke or its process exited."""
        return self._peer.alive

    def _dispatch(self, fields: list[bytes]) -> None:
        command = self._commands.get(fields[1].decode()) if len(fields) > 1 else None
        if command is None:
            return
        kind = fields[0]
        if kind == b"P":
            command.pid = int(fields[2])
            command.started.set()
        elif kind == b"X":
            command.status = int(fields[2])
            command.duration_s = int(fields[3]) / 1e9
            command.started.set()
            command.ended.set()
        elif kind == b"F":
            command.failure = fields[2].decode("utf-8", "replace")
            command.started.set()
            command.ended.set()

    async def _until(self, event: anyio.Event) -> None:
        """Read and dispatch messages until ``event`` is set.

        Raises:
            InitDied: the init is gone.
        """
        while not event.is_set():
            if self._peer.dead:
                raise InitDied("the sandbox's init exited")
            async with self._reading:
                if event.is_set():
                    return
                try:
                    self._dispatch(await self._peer.receive())
                except InitDied:
                    for command in self._commands.values():
                        command.started.set()
                        command.ended.set()
                    raise

    async def spawn(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], fds: Sequence[int]
    ) -> str:
        """Ask the init to run ``argv`` with standard streams ``fds`` (stdin, stdout, stderr).

        The descriptors are duplicated into the command; the caller still owns (and closes) its
        copies. Returns the command's id once it runs.

        Raises:
            InitDied: the init is gone.
            SpawnFailed: the init could not fork.
        """
        command_id = f"{self._prefix}.{next(self._ids)}"
        command = self._commands[command_id] = _Command()
        fields = [b"S", command_id.encode(), os.fsencode(cwd), str(len(argv)).encode()]
        fields += [os.fsencode(a) for a in argv]
        fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
        try:
            await self._peer.send(fields, fds)
            await self._until(command.started)
        except BaseException:
            self._commands.pop(command_id, None)
            raise
        if command.failure is not None:
            self._commands.pop(command_id, None)
            raise SpawnFailed(command.failure)
        return command_id

    def pid(self, command_id: str) -> int | None:
        """The pid (as the sandbox sees it) of a running command."""
        command = self._commands.get(command_id)
        return command.pid if command else None

    async def wait(self, command_id: str) -> Exited:
        """Wait for the command to end and forget it.

        Raises:
            InitDied: the init is gone (the command with it).
        """
        command = self._commands[command_id]
        try:
            await self._until(command.ended)
        finally:
            if command.ended.is_set():
                self._commands.pop(command_id, None)
        if command.status is None:
            raise InitDied("the sandbox's init exited")
        return Exited(command.status, command.duration_s)

    async def kill_tree(self, command_id: str, sig: int) -> None:
        """Send ``sig`` to everything the command started (group, session, descendants, and
        processes still carrying its id). Never raises."""
        with contextlib.suppress(InitDied):
            await self._peer.send([b"K", command_id.encode(), str(sig).encode()])

    async def signal(self, pid: int, sig: int, newer_than: int = -1) -> None:
        """Send ``sig`` to sandbox process ``pid`` (``newer_than`` < 0), or to the processes of
        its tree with a pid above ``newer_than``. Never raises."""
        with contextlib.suppress(InitDied):
            await self._peer.send(
                [b"T", str(pid).encode(), str(sig).encode(), str(newer_than).encode()]
            )

    async def kill(self) -> None:
        """Kill the init and every process of the sandbox, and reap the host process.

        Under bwrap, killing ``bwrap`` kills the init (``--die-with-parent``), and the kernel
        kills the rest of a PID namespace whose PID 1 died (a forked init is that PID 1).
        Without a jail the init is asked to kill the sandbox's processes first. Never raises.
        """
        with anyio.CancelScope(shield=True):
            if not self._jailed and not self._peer.dead and self.process.poll() is None:
                with contextlib.suppress(InitDied):
                    await self._peer.send([b"A", self._prefix.encode() + b"."])
                    await self.process.wait(_KILL_GRACE_S)
            self.process.kill()
            self._peer.close()
            await self.process.wait(_REAP_BUDGET_S)
        for command in self._commands.values():
            command.started.set()
            command.ended.set()
