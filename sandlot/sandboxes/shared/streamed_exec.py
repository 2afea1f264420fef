"""Commands and shell sessions over an attached exec: a process with stdin and output streams.

A platform whose exec starts a process and hands back its streams (Modal's
``ContainerProcess``, docker's hijacked exec connection; an SSH channel or a Kubernetes exec
are the same shape) needs only
:meth:`StreamedExec._spawn`, returning a :class:`Process`. :class:`StreamedExec` builds ``_run``
on it (the :mod:`sandlot.sandboxes.shared.remote_shell` wrapper and exec marker, stdin in drained
pieces, both streams read concurrently into the caps, the process-tree kill by a second exec)
and :class:`ProcessChannel`, a session channel over a ``bash`` spawned with open stdin.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import posixpath
import secrets
import shlex
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

import anyio

from sandlot.errors import SandboxDeadError, SandboxError
from sandlot.runtimes.channel_session import ChannelSession
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.capped import CappedBuffer, CappedOutput
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.shared.remote_channel import RemoteShellChannel, Runner
from sandlot.sandboxes.shared.status_tail import StatusTail
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

    def close(self) -> None:
        """Drop what the platform holds for the process (a connection); idempotent."""


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
    status_in_band: ClassVar[bool] = False
    """The exit status is the wrapper's last stdout line (``remote_shell.exec_argv(
    report_status=True)``), not the platform's (Podman forgets an ended exec at once, see
    docs/docker.md). A command without stdin then reads ``/dev/null`` and the exec's stdin
    stays open: a TLS socket cannot half-close and still read."""
    sweep_orphans: ClassVar[bool] = False
    """The kills also take the unmarked orphans (PID 1 is ``remote_shell.init_argv``'s and
    nothing else runs in the sandbox)."""
    kill_attempts: ClassVar[int] = 1
    """Rounds of the in-sandbox killer before :meth:`_stuck`."""
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
        """Run ``command`` under :mod:`sandlot.sandboxes.shared.remote_shell`'s wrapper (see
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
        command = await self._fit_argv(run.command, marker)
        argv = remote_shell.exec_argv(
            command, run.cwd, report_status=self.status_in_band, stdin=run.stdin is not None
        )
        env = {**run.env, remote_shell.EXEC_MARKER_ENV: marker}
        timeout, out = run.timeout, CappedOutput(self.options.max_output_bytes)
        limit = timeout
        if limit is None:
            limit = max(0.0, self._ends_at - time.monotonic()) + self.lifetime_margin_s
        proc: Process | None = None

        async def body() -> int:
            nonlocal proc
            proc = await self._call("exec", self._spawn, argv, env, timeout)
            return await self._drive(proc, run.stdin, out)

        async def stop() -> None:
            if proc is not None:
                proc.close()
                await self._kill(marker, proc)

        try:
            code = await self._bounded(limit, body, stop)
        finally:
            if proc is not None:
                proc.close()
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
        ``out``, and wait; the exit status (with ``status_in_band``: from stdout's last line).

        Raises:
            SandboxDeadError / SandboxError: a call or a stream failed (a dead sandbox first,
                else the first failure; raised as such, not inside an ``ExceptionGroup``), or
                the in-band status line was lost (the wrapper was killed from inside).
        """
        failures: list[SandboxError] = []
        stdout: CappedBuffer | StatusTail = out.stdout
        end = True
        if self.status_in_band:
            secret = secrets.token_hex(16).encode()
            stdin, end = secret + b"\n" + (stdin or b""), stdin is not None
            stdout = StatusTail(out.stdout, secret)

        async def guarded(what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
            try:
                await self._call(what, fn, *args)
            except SandboxError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(guarded, "exec stdin", _feed, proc, stdin, end)
                tg.start_soon(guarded, "exec stdout", _pump, proc.stdout, stdout)
                tg.start_soon(guarded, "exec stderr", _pump, proc.stderr, out.stderr)
        finally:
            # Also on a timeout or cancellation: what arrived is kept.
            code = stdout.end() if isinstance(stdout, StatusTail) else None
        if failures:
            raise next((e for e in failures if isinstance(e, SandboxDeadError)), failures[0])
        if not self.status_in_band:
            return int(await self._call("exec wait", proc.wait))
        if code is None:
            raise await self._gone() or SandboxError(
                f"sandbox {self.id}: the command's exit status was lost: its wrapper shell "
                "was killed, or a process kept writing to its output after the status line",
                retryable=False,
            )
        return code

    async def _run_quiet(self, argv: list[str]) -> int:
        """Run ``argv`` (one of ours) to completion, output discarded; its exit status. Its
        marker is its own, so the orphan sweep never takes it for an orphan."""
        env = {remote_shell.EXEC_MARKER_ENV: f"internal-{uuid.uuid4().hex}"}
        if self.status_in_band:
            argv = remote_shell.exec_argv(shlex.join(argv), "/", report_status=True, stdin=False)
        proc = await self._call("exec", self._spawn, argv, env, None)
        try:
            return await self._drive(proc, None, CappedOutput(0))
        finally:
            proc.close()

    async def _kill(self, marker: str, proc: Process) -> None:
        """Kill the processes carrying ``marker`` (SIGTERM, ``stop_grace_s``, SIGKILL) with a
        second exec, ``kill_attempts`` rounds within 15 s more; when survivors remain
        (:meth:`_exec_running`), :meth:`_stuck`. A failure is logged, not raised."""
        grace = self.options.stop_grace_s
        argv = remote_shell.kill_argv(marker, grace, sweep_orphans=self.sweep_orphans)
        with anyio.move_on_after(grace + _KILL_BUDGET_S):
            try:
                for _ in range(self.kill_attempts):
                    # Repeated because a command whose exec was still starting when a round
                    # scanned /proc can only be found by a later round.
                    if await self._run_quiet(argv) == 0 and not await self._exec_running(proc):
                        return
            except SandboxDeadError:
                return  # the sandbox went down: nothing left to kill
            except SandboxError as exc:
                log.warning("sandbox %s: could not kill exec %s: %s", self.id, marker, exc)
        await self._stuck(marker, proc)

    async def _exec_running(self, proc: Process) -> bool:
        """Whether the platform still runs ``proc`` after a kill round (default: cannot tell)."""
        return False

    async def _stuck(self, marker: str, proc: Process) -> None:
        """The in-sandbox killer could not stop ``proc``: log it (a platform with a harsher
        means, e.g. docker's reset of the container, overrides this)."""
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
            return ProcessChannel(proc, marker, self.exec, sweep_orphans=self.sweep_orphans)

        return ChannelSession(name, config, open_channel, self.is_alive)


async def _feed(proc: Process, data: bytes | None, end: bool) -> None:
    view = memoryview(data or b"")
    # The command may exit without reading all of its input, like a closed pipe.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for start in range(0, len(view), _STDIN_CHUNK):
            await proc.send(bytes(view[start : start + _STDIN_CHUNK]))
        if end:
            await proc.send_eof()


async def _pump(stream: AsyncIterable[bytes | str], buf: CappedBuffer | StatusTail) -> None:
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

    def __init__(
        self, proc: Process, marker: str, run: Runner, *, sweep_orphans: bool = False
    ) -> None:
        super().__init__(marker, run)
        self.sweep_orphans = sweep_orphans
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
        self._proc.close()
