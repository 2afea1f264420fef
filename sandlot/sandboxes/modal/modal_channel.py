"""``ModalChannel``: the ``modal`` backend's session channel, a ``bash`` exec with open stdin.

``Sandbox.exec("/bin/sh", "-c", "cd DIR && exec bash --noprofile --norc 2>&1", text=False)``
(modal 1.6.4, ``modal/sandbox/_sandbox.py`` and ``container_process.py``; reference
https://modal.com/docs/reference/modal.Sandbox#exec) returns a ``ContainerProcess`` whose
``stdin`` takes the session's commands (``write`` + ``drain.aio``) and whose ``stdout`` streams
the shell's merged output as it is printed. A reader task moves stdout chunks into a queue, so
a cancelled :meth:`ModalChannel.receive` loses nothing (cancelling the SDK's stream iterator
would close it). Modal's SDK runs on asyncio only, so the channel does too.

Signals, and the kill when the channel closes, are :class:`RemoteShellChannel`'s (through the
session's exec marker). An output stream that fails (the sandbox died, the worker's gRPC stream
broke) ends the channel like an EOF; the session then asks whether the sandbox lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import anyio

from sandlot.sandboxes import remote_shell
from sandlot.sandboxes.remote_channel import RemoteShellChannel, Runner

log = logging.getLogger("sandlot.sandboxes.modal")

_EXIT_WAIT_S = 1.0


class ModalChannel(RemoteShellChannel):
    """An attached ``bash`` exec in a Modal sandbox. Use :meth:`start`."""

    def __init__(self, proc: Any, marker: str, run: Runner) -> None:
        super().__init__(marker, run)
        self._proc = proc
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, sandbox: Any, *, cwd: str, run: Runner) -> ModalChannel:
        """Start ``bash --noprofile --norc`` in the Modal sandbox ``sandbox``, in ``cwd``.

        Args:
            sandbox: the ``modal.Sandbox``.
            cwd: the shell's starting directory.
            run: the sandlot sandbox's ``exec``, used to deliver signals.

        Raises:
            modal.exception.Error (or a transport error): the exec was refused; the caller
                translates it.
        """
        marker = uuid.uuid4().hex
        proc = await sandbox.exec.aio(
            *remote_shell.shell_argv(cwd),
            env={remote_shell.EXEC_MARKER_ENV: marker},
            text=False,
        )
        return cls(proc, marker, run)

    async def _read(self) -> None:
        try:
            async for chunk in self._proc.stdout:
                if chunk:
                    self._queue.put_nowait(chunk if isinstance(chunk, bytes) else chunk.encode())
        except Exception as exc:  # a dead sandbox or a broken stream: the output has ended
            log.debug("modal session output ended with %s: %s", type(exc).__name__, exc)
        finally:
            self._queue.put_nowait(b"")

    async def send(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain.aio()
        except Exception as exc:
            raise BrokenPipeError(f"the shell's stdin is gone: {exc}") from exc

    async def receive(self) -> bytes:
        chunk = await self._queue.get()
        if not chunk:
            self._queue.put_nowait(b"")  # stays ended for every later call
        return chunk

    async def exit_status(self) -> int | None:
        with anyio.move_on_after(_EXIT_WAIT_S), contextlib.suppress(Exception):
            code = await self._proc.wait.aio()
            return None if code is None else int(code)
        return None

    async def _release(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        with contextlib.suppress(Exception):
            self._proc.stdin.write_eof()
            await self._proc.stdin.drain.aio()
