"""``LocalChannel``: the ``local`` backend's session channel, a ``bash`` spawned by the init.

The sandbox's init (:class:`~sandlot.sandboxes.local.init_client.InitProcess`) spawns the
shell in the sandbox's one jail, like any command, with stdin and a merged stdout/stderr on
pipes to us. Signals go through the init, which sees pids as the shell does. Closing the
channel kills the shell's process tree (its session, descendants, and processes still carrying
its command id); the sandbox's other processes are untouched.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping

import anyio

from sandlot.runtimes.channel import Channel
from sandlot.sandboxes.local.init_client import InitProcess
from sandlot.sandboxes.local.peer import InitDied

_CHUNK = 64 * 1024
_EXIT_WAIT_S = 1.0


class LocalChannel(Channel):
    """Pipes to one ``bash --noprofile --norc`` run by the sandbox's init. Use :meth:`start`."""

    def __init__(self, init: InitProcess, command_id: str, stdin: int, output: int) -> None:
        self._init = init
        self._id = command_id
        self._stdin = stdin
        self._output = output
        self._status: int | None = None
        self._closed = False

    @classmethod
    async def start(cls, init: InitProcess, *, cwd: str, env: Mapping[str, str]) -> LocalChannel:
        """Spawn the shell in ``cwd`` (as the sandbox sees it) with environment ``env``.

        Raises:
            InitDied: the sandbox's init is gone.
            SpawnFailed: the init could not fork.
        """
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            command_id = await init.spawn(
                ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, fds=(stdin_r, out_w, out_w)
            )
        except BaseException:
            for fd in (stdin_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(out_w)
        os.set_blocking(stdin_w, False)
        os.set_blocking(out_r, False)
        return cls(init, command_id, stdin_w, out_r)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._closed:
                raise BrokenPipeError("the session is closed")
            try:
                view = view[os.write(self._stdin, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._stdin)

    async def receive(self) -> bytes:
        while not self._closed:
            try:
                return os.read(self._output, _CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self._output)
            except OSError:
                return b""
        return b""

    async def signal_shell(self, sig: int, shell_pid: int) -> None:
        await self._init.signal(shell_pid, sig)

    async def signal_newer(self, sig: int, newer_than: int) -> None:
        shell_pid = self._init.pid(self._id)
        if shell_pid is not None:
            await self._init.signal(shell_pid, sig, newer_than)

    async def exit_status(self) -> int | None:
        if self._status is None:
            with anyio.move_on_after(_EXIT_WAIT_S), contextlib.suppress(InitDied, KeyError):
                self._status = (await self._init.wait(self._id)).status
        return self._status

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._init.kill_tree(self._id, signal.SIGKILL)
            with anyio.move_on_after(_EXIT_WAIT_S), contextlib.suppress(InitDied, KeyError):
                await self._init.wait(self._id)
        for fd in (self._stdin, self._output):
            with contextlib.suppress(OSError):
                os.close(fd)
