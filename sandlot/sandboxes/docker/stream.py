"""An exec's hijacked connection, written and read asynchronously, without a thread, as a
:class:`~sandlot.sandboxes.shared.streamed_exec.Process`.

``exec_start(socket=True)`` hands over the hijacked HTTP connection. Without a TTY the engine
frames the output as described in the Docker Engine API (v1.41, "Attach to a container",
https://docs.docker.com/engine/api/v1.41/#tag/Container/operation/ContainerAttach): an 8-byte
header ``[stream, 0, 0, 0, size (uint32 big-endian)]`` followed by ``size`` bytes, stream 1 being
stdout and 2 stderr. Standard input is written to the same connection and ended by a write
half-close. The SDK's own demultiplexer (``docker.utils.socket.frames_iter``) reads a blocking
socket, which would hold a worker thread for as long as a command runs.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

_RECV_BYTES = 256 * 1024
_SEND_BYTES = 64 * 1024
_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2
# Errors of a non-blocking socket call that mean "try again" (TLS engines raise the SSL ones).
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class AttachedProcess:
    """An exec as a ``Process``: what ``exec_start(socket=True)`` returned (read by nobody
    else), made non-blocking and demultiplexed into ``stdout`` and ``stderr``.

    docker 7.1 returns a ``socket.SocketIO`` for unix:// and tcp:// and the ``SSLSocket`` itself
    for TLS. ``stdout`` reads the connection and hands stderr pieces on to ``stderr`` (which
    ends with it). ``inspect`` is the engine's ``exec_inspect`` (``{}`` once it forgot the
    exec); ``wait`` raises ``LookupError`` while the exec runs or when the engine has no status.
    """

    def __init__(self, attached: Any, inspect: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        # SocketIO keeps its socket private; the SDK's own examples reach it the same way.
        sock = attached._sock if isinstance(attached, socket.SocketIO) else attached  # type: ignore[attr-defined]
        if not isinstance(sock, socket.socket):
            raise TypeError(f"unsupported exec attach transport {type(attached).__name__}")
        self._attached = attached
        self._sock = sock
        sock.setblocking(False)
        self._data = bytearray(_read_ahead(attached))
        self._stream = 0  # stream id of the current frame
        self._due = 0  # its payload bytes not yet received
        self._eof = False
        self._inspect = inspect
        self._stderr: asyncio.Queue[bytes] = asyncio.Queue()
        self.stdout: AsyncIterable[bytes | str] = self._read()
        self.stderr: AsyncIterable[bytes | str] = self._errors()

    async def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin."""
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view[:_SEND_BYTES]) :]
            except _WOULD_BLOCK:
                await anyio.wait_writable(self._sock)

    async def send_eof(self) -> None:
        """Close stdin: a write half-close."""
        self._sock.shutdown(socket.SHUT_WR)

    async def _read(self) -> AsyncIterator[bytes]:
        try:
            while pieces := await self._receive():
                for stream, data in pieces:
                    if stream == _STDERR:
                        self._stderr.put_nowait(data)
                    elif stream == _STDOUT:
                        yield data
        finally:
            self._stderr.put_nowait(b"")

    async def _errors(self) -> AsyncIterator[bytes]:
        while data := await self._stderr.get():
            yield data
        self._stderr.put_nowait(b"")  # stays ended

    async def _receive(self) -> list[tuple[int, bytes]]:
        """The next payload pieces as ``(stream id, bytes)``, at least one; ``[]`` at the end."""
        while True:
            pieces = self._parse()
            if pieces or self._eof:
                return pieces
            try:
                data = self._sock.recv(_RECV_BYTES)
            except _WOULD_BLOCK:
                await anyio.wait_readable(self._sock)
                continue
            except OSError:  # reset by the engine: the end, as for a closed pipe
                data = b""
            self._eof = not data
            self._data += data

    def _parse(self) -> list[tuple[int, bytes]]:
        pieces = []
        while self._data:
            if self._due:
                piece = bytes(self._data[: self._due])
                del self._data[: len(piece)]
                self._due -= len(piece)
                pieces.append((self._stream, piece))
            elif len(self._data) >= _HEADER.size:
                self._stream, self._due = _HEADER.unpack_from(self._data)
                del self._data[: _HEADER.size]
            else:
                break
        return pieces

    async def running(self) -> bool:
        return bool((await self._inspect()).get("Running"))

    async def wait(self) -> int:
        info = await self._inspect()
        if info.get("Running") or info.get("ExitCode") is None:
            raise LookupError("the engine has no exit status for this exec")
        return int(info["ExitCode"])

    def close(self) -> None:
        """Drop the connection (idempotent)."""
        self._attached.close()
        self._sock.close()


def _read_ahead(attached: Any) -> bytes:
    """Stream bytes the HTTP client already buffered while it parsed the response headers.

    They are the start of the multiplexed stream: http.client reads headers through a
    ``BufferedReader``; when the engine sends the first frames right behind them (a fast command
    on a loaded machine), those bytes sit in that buffer and never show up on the socket.
    docker 7.1 keeps the response on the returned socket as ``_response``. The socket must be
    non-blocking already (``peek`` then returns what is buffered, or readable, without waiting).
    """
    response = getattr(attached, "_response", None)
    if response is None:
        return b""
    reader = response.raw._fp.fp
    buffered: bytes = reader.peek()
    return reader.read(len(buffered)) if buffered else b""
