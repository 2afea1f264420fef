"""One ``pods/exec`` websocket as a :class:`~sandlot.sandboxes.shared.streamed_exec.Process`.

The protocol (``k8s.io/apimachinery/pkg/util/httpstream/wsstream``, KEP-4006): every binary
message starts with a channel byte: 0 stdin (client to server), 1 stdout, 2 stderr, 3 the
error channel (one JSON ``Status`` when the command ended: ``{"status": "Success"}``, or
``Failure`` with reason ``NonZeroExitCode`` and the code in ``details.causes[0].message``, or
another failure of the exec itself), 4 terminal resize (unused: no TTY). ``v5.channel.k8s.io``
adds a close message, ``[255, channel]``: closing channel 0 is stdin's EOF. A server that
speaks only ``v4.channel.k8s.io`` skips messages for channels it does not know (the
``Frame is targeted for a reader ... not valid`` branch of ``wsstream/conn.go``), so the close
is sent either way; there, a command that reads its stdin to the end waits until its timeout
(Kubernetes 1.30 and later offer v5: docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from sandlot.errors import SandboxError

PROTOCOLS = "v5.channel.k8s.io,v4.channel.k8s.io"
"""The ``Sec-WebSocket-Protocol`` offer, best first."""
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
CLOSE = 255
_END = b""
_tasks: set[asyncio.Task[Any]] = set()  # closes in flight, kept from the garbage collector


class ExecStreamLost(SandboxError):
    """The exec's websocket ended without the status message (a dropped connection, the pod's
    node gone): its exit status is unknown."""


def exit_code(status: bytes) -> int:
    """The exit status in the error channel's ``Status`` (see the module docstring).

    Raises:
        SandboxError: the exec itself failed (no such container, the runtime refused...), with
            the server's message.
    """
    try:
        body = json.loads(status)
    except ValueError as exc:
        raise SandboxError(f"exec: unreadable status {status[:200]!r}") from exc
    if body.get("status") == "Success":
        return 0
    if body.get("reason") == "NonZeroExitCode":
        for cause in (body.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause["message"])
    raise SandboxError(f"exec failed: {body.get('message') or body}", retryable=True)


class ExecStream:
    """The streams of one exec: ``stdout``/``stderr`` iterate over byte chunks (they raise
    :class:`ExecStreamLost` when the socket broke), ``send``/``send_eof`` feed stdin, ``wait``
    gives the exit status from the status message.

    Args:
        ws: the client's open websocket (aiohttp's ``ClientWebSocketResponse``).
    """

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._queues: dict[int, asyncio.Queue[bytes]] = {
            STDOUT: asyncio.Queue(),
            STDERR: asyncio.Queue(),
        }
        self._status = bytearray()
        self._failure: BaseException | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.stdout: AsyncIterable[bytes | str] = self._stream(STDOUT)
        self.stderr: AsyncIterable[bytes | str] = self._stream(STDERR)

    async def _read(self) -> None:
        from aiohttp import WSMsgType

        try:
            async for msg in self._ws:
                if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                    break
                data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                if len(data) < 2:
                    continue  # a channel's empty opening message
                channel, payload = data[0], data[1:]
                if channel == STATUS:
                    self._status += payload
                elif channel in self._queues:
                    self._queues[channel].put_nowait(payload)
        except Exception as exc:  # the connection broke
            self._failure = exc
        finally:
            for queue in self._queues.values():
                queue.put_nowait(_END)

    async def _stream(self, channel: int) -> AsyncIterator[bytes]:
        queue = self._queues[channel]
        while (chunk := await queue.get()) is not _END:
            yield chunk
        queue.put_nowait(_END)  # ended for every later reader too
        if not self._status:
            raise self._lost()

    def _lost(self) -> ExecStreamLost:
        detail = f": {type(self._failure).__name__}: {self._failure}" if self._failure else ""
        return ExecStreamLost(
            f"the exec's websocket ended without its exit status{detail}", retryable=True
        )

    async def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin."""
        if self._ws.closed:
            raise BrokenPipeError("the exec's websocket is closed")
        await self._ws.send_bytes(bytes([STDIN]) + data)

    async def send_eof(self) -> None:
        """Close the command's stdin (v5's close message; a v4 server ignores it)."""
        if not self._ws.closed:
            await self._ws.send_bytes(bytes([CLOSE, STDIN]))

    async def wait(self) -> int:
        """The command's exit status, once the server sent it and closed the socket.

        Raises:
            ExecStreamLost: the socket ended without a status.
            SandboxError: the status says the exec itself failed.
        """
        await asyncio.shield(self._reader)
        if not self._status:
            raise self._lost()
        return exit_code(bytes(self._status))

    def close(self) -> None:
        """Close the socket (in the background) and stop reading; idempotent."""
        self._reader.cancel()
        if not self._ws.closed:
            task = asyncio.get_running_loop().create_task(self._close())
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
