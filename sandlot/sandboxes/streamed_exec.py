"""Commands and shell sessions over an attached exec: a process with stdin and output streams.

A platform whose exec starts a process and hands back its streams (Modal's
``ContainerProcess``; an SSH channel or a Kubernetes exec are the same shape) needs only
:meth:`StreamedExec._spawn`, returning a :class:`Process`. :class:`StreamedExec` builds ``_run``
on it (the :mod:`sandlot.sandboxes.remote_shell` wrapper and exec marker, stdin in drained
pieces, both streams read concurrently into the caps, the process-tree kill by a second exec)
and :class:`ProcessChannel`, a session channel over a ``bash`` spawned with open stdin.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import posixpath
import shlex
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

import anyio

from sandlot.errors import SandboxDeadError, SandboxError
from sandlot.runtimes.channel_session import ChannelSession
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes import remote_shell
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.capped import CappedBuffer, CappedOutput
from sandlot.sandboxes.remote_channel import RemoteShellChannel, Runner
from sandlot.sandboxes.transport import ExecOptions, RunOutput, RunRequest

log = logging.getLogger("sandlot.sandboxes")
T = TypeVar("T")

_KILL_BUDGET_S = 15.0
_EXIT_WAIT_S = 1.0
# stdin goes down in pieces, each drained: Modal buffers at most 16 MiB between drains
# (TASK_COMMAND_ROUTER_MAX_BUFFER_SIZE in modal/io_streams.py; 2 MiB through the server).
_STDIN_CHUNK = 1024 * 1024


class Process(Protocol):
    """A process started in the sandbox with its streams attached (a chunk may be ``str``)."""

    stdout: AsyncIterable[bytes | str]
    stderr: AsyncIterable[bytes | str]

    async def send(self, data: bytes) -> None:
        """Write ``data`` to stdin and wait until the platform took it."""

    async def send_eof(self) -> None:
        """Close stdin."""

    async def wait(self) -> int:
        """The exit status, once the process ended."""


class StreamedExec(Sandbox):
    """A transport whose commands are attached processes (see the module docstring).

    A subclass implements :meth:`_spawn` and :meth:`_call`, sets ``_ends_at`` (the monotonic
    end of the sandbox's lifetime) once started, and may set the class attributes below; its
    options extend :class:`~sandlot.sandboxes.transport.ExecOptions`.
    """

    lifetime_margin_s: ClassVar[float] = 30.0
    """A command without a timeout still ends this long after the sandbox's lifetime: a worker
    that died without closing the output stream must not hang the caller."""
    argv_command_bytes: ClassVar[int | None] = None
    """Commands longer than this (bytes) go through a file; ``None``: no argv limit."""
    platform_timeout_code: ClassVar[int | None] = None
    """The exit status the platform gives a process its own timeout ended (Modal: -1)."""
    options: ExecOptions
    _ends_at = 0.0

    @abc.abstractmethod
    async def _spawn(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Process:
        """Start ``argv`` with ``env`` added; ``timeout`` (seconds, or ``None``) is the
        command's, for a backstop the platform enforces should this process die."""

    @abc.abstractmethod
    async def _call(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``, a platform failure translated: ``SandboxDeadError`` when the
        sandbox is gone, else ``SandboxError`` (retryable for transient faults)."""

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``command`` under :mod:`sandlot.sandboxes.remote_shell`'s wrapper (see
        :meth:`Transport._run`).

        stdout and stderr are read concurrently. At ``timeout`` (or on cancellation) every
        process of the command is killed (SIGTERM, ``stop_grace_s``, SIGKILL) by a second exec.
        ``timeout=None`` still ends ``lifetime_margin_s`` after the sandbox's lifetime
        (``spec.timeout_s``) with ``SandboxDeadError``.

        Raises:
            SandboxDeadError: the sandbox finished (terminated, lifetime over, crashed).
            SandboxError: the platform failed, an output stream included; ``retryable`` for
                transient faults. Never an ``ExceptionGroup``.
        """
        marker = uuid.uuid4().hex
        argv = remote_shell.exec_argv(await self._fit_argv(run.command, marker), run.cwd)
        env = {**run.env, remote_shell.EXEC_MARKER_ENV: marker}
        timeout, out = run.timeout, CappedOutput(self.options.max_output_bytes)
        limit = timeout
        if limit is None:
            limit = max(0.0, self._ends_at - time.monotonic()) + self.lifetime_margin_s
        launched = False

        async def body() -> int:
            nonlocal launched
            proc = await self._call("exec", self._spawn, argv, env, timeout)
            launched = True
            return await self._drive(proc, run.stdin, out)

        async def stop() -> None:
            if launched:
                await self._kill(marker)

        code = await self._bounded(limit, body, stop)
        if code is None and timeout is None:
            raise await self._gone() or SandboxDeadError(
                f"sandbox {self.id} ({self.backend_id}): a command without a timeout outlived "
                f"the sandbox's lifetime ({self.spec.timeout_s:g} s) by "
                f"{self.lifetime_margin_s:g} s"
            )
        platform_timeout = code is not None and code == self.platform_timeout_code
        if code is not None and (platform_timeout or code >= 128):
            dead = await self._gone()
            if dead is not None:
                raise dead
        return RunOutput.of(None if platform_timeout else code, out)

    async def _fit_argv(self, command: str, marker: str) -> str:
        """``command``, or, when it is longer than ``argv_command_bytes``, a short command that
        sources it from a file written with ``_put_bytes`` (and removes the file)."""
        limit = self.argv_command_bytes
        if limit is None or len(command.encode()) <= limit:
            return command
        path = f"/tmp/sandlot-cmd-{marker}"
        await self._put_bytes(path, command.encode())
        quoted = shlex.quote(path)
        # Opened, unlinked, then sourced: nothing is left behind whatever the command does.
        return f"exec 9<{quoted} && rm -f -- {quoted} && . /dev/fd/9"

    async def _drive(self, proc: Process, stdin: bytes | None, out: CappedOutput) -> int:
        """Feed ``stdin`` (then EOF), read stdout and stderr to their ends concurrently into
        ``out``, and wait; the exit status.

        Raises:
            SandboxDeadError / SandboxError: a call or a stream failed (a dead sandbox first,
                else the first failure; raised as such, not inside an ``ExceptionGroup``).
        """
        await self._call("exec stdin", _feed, proc, stdin)
        failures: list[SandboxError] = []

        async def read(what: str, stream: AsyncIterable[bytes | str], buf: CappedBuffer) -> None:
            try:
                await self._call(what, _pump, stream, buf)
            except SandboxError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "exec stdout", proc.stdout, out.stdout)
            tg.start_soon(read, "exec stderr", proc.stderr, out.stderr)
        if failures:
            raise next((e for e in failures if isinstance(e, SandboxDeadError)), failures[0])
        return int(await self._call("exec wait", proc.wait))

    async def _run_quiet(self, argv: list[str]) -> int:
        """Run ``argv`` to completion, output discarded; its exit status."""
        proc = await self._call("exec", self._spawn, argv, {}, None)
        return await self._drive(proc, None, CappedOutput(0))

    async def _kill(self, marker: str) -> None:
        """Kill the processes carrying ``marker`` (SIGTERM, ``stop_grace_s``, SIGKILL) with a
        second exec, within 15 s more; a failure is logged, not raised."""
        grace = self.options.stop_grace_s
        with anyio.move_on_after(grace + _KILL_BUDGET_S):
            try:
                await self._run_quiet(remote_shell.kill_argv(marker, grace))
                return
            except SandboxError as exc:
                log.warning("sandbox %s: could not kill exec %s: %s", self.id, marker, exc)
                return
        log.warning("sandbox %s: exec %s may still be running", self.id, marker)

    async def _open_shell(self, name: str, config: SessionConfig) -> BashSession:
        """A session whose ``bash`` is a process with open stdin (:class:`ProcessChannel`)."""
        cwd = posixpath.join(self.spec.workdir, config.cwd or "")

        async def open_channel() -> ProcessChannel:
            self._check_usable()
            marker = uuid.uuid4().hex
            env = {remote_shell.EXEC_MARKER_ENV: marker}
            argv = remote_shell.shell_argv(cwd)
            proc = await self._call("starting a shell", self._spawn, argv, env, None)
            return ProcessChannel(proc, marker, self.exec)

        return ChannelSession(name, config, open_channel, self.is_alive)


async def _feed(proc: Process, data: bytes | None) -> None:
    view = memoryview(data or b"")
    for start in range(0, len(view), _STDIN_CHUNK):
        await proc.send(bytes(view[start : start + _STDIN_CHUNK]))
    await proc.send_eof()


async def _pump(stream: AsyncIterable[bytes | str], buf: CappedBuffer) -> None:
    async for chunk in stream:
        buf.feed(chunk if isinstance(chunk, bytes) else chunk.encode())


class ProcessChannel(RemoteShellChannel):
    """The session channel of a spawned ``bash`` with open stdin and merged output.

    A reader task moves stdout chunks into a queue, so a cancelled :meth:`receive` loses
    nothing (cancelling the SDK's stream iterator would close it). It is an asyncio task: the
    SDKs of such platforms (Modal's) run on asyncio only. Signals, and the kill when the
    channel closes, are :class:`RemoteShellChannel`'s (through the exec marker). An output
    stream that fails (the sandbox died, the stream broke) ends the channel like an EOF; the
    session then asks whether the sandbox lives.
    """

    def __init__(self, proc: Process, marker: str, run: Runner) -> None:
        super().__init__(marker, run)
        self._proc = proc
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self._proc.stdout:
                if chunk:
                    self._queue.put_nowait(chunk if isinstance(chunk, bytes) else chunk.encode())
        except Exception as exc:  # a dead sandbox or a broken stream: the output has ended
            log.debug("session output ended with %s: %s", type(exc).__name__, exc)
        finally:
            self._queue.put_nowait(b"")

    async def send(self, data: bytes) -> None:
        try:
            await self._proc.send(data)
        except Exception as exc:
            raise BrokenPipeError(f"the shell's stdin is gone: {exc}") from exc

    async def receive(self) -> bytes:
        chunk = await self._queue.get()
        if not chunk:
            self._queue.put_nowait(b"")  # stays ended for every later call
        return chunk

    async def exit_status(self) -> int | None:
        with anyio.move_on_after(_EXIT_WAIT_S), contextlib.suppress(Exception):
            return await self._proc.wait()
        return None

    async def _release(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        with contextlib.suppress(Exception):
            await self._proc.send_eof()
