"""Reading an exec's multiplexed output stream asynchronously, without a thread.

``exec_start(socket=True)`` hands over the hijacked HTTP connection. Without a TTY the engine
frames the output as described in the Docker Engine API (v1.41, "Attach to a container",
https://docs.docker.com/engine/api/v1.41/#tag/Container/operation/ContainerAttach): an 8-byte
header ``[stream, 0, 0, 0, size (uint32 big-endian)]`` followed by ``size`` bytes, stream 1 being
stdout and 2 stderr. Standard input is written to the same connection and ended by a write
half-close.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import anyio

from sandlot.sandboxes.capped import CappedBuffer, CappedOutput

_RECV_BYTES = 256 * 1024
_SEND_BYTES = 64 * 1024
_HEADER_BYTES = 8
_STDOUT, _STDERR = 1, 2

WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
"""Errors of a non-blocking socket call that mean "try again" (TLS engines raise the SSL ones)."""


def raw_socket(attached: Any) -> socket.socket:
    """The ``socket.socket`` behind what ``exec_start(socket=True)`` returned.

    docker 7.1 returns a ``socket.SocketIO`` for unix:// and tcp:// and the ``SSLSocket`` itself
    for TLS.
    """
    # SocketIO keeps its socket private; the SDK's own examples reach it the same way.
    sock = attached._sock if isinstance(attached, socket.SocketIO) else attached  # type: ignore[attr-defined]
    if not isinstance(sock, socket.socket):
        raise TypeError(f"unsupported exec attach transport {type(attached).__name__}")
    return sock


def read_ahead(attached: Any) -> bytes:
    """Stream bytes the HTTP client already buffered while it parsed the response headers.

    Whoever reads the raw socket of an attached exec (:func:`pump`,
    :class:`sandlot.sandboxes.docker.docker_channel.DockerChannel`) must take these bytes first:
    they are the start of the multiplexed stream. http.client reads headers through a
    ``BufferedReader``; when the engine sends the first frames right behind them (a fast command
    on a loaded machine), those bytes sit in that buffer and never show up on the socket.
    docker 7.1 keeps the response on the returned socket as ``_response``.

    Args:
        attached: what ``exec_start(socket=True)`` returned, its socket already non-blocking
            (``peek`` then returns what is buffered, or readable, without waiting).

    Returns:
        The buffered bytes, consumed from the reader; ``b""`` when there are none.
    """
    response = getattr(attached, "_response", None)
    if response is None:
        return b""
    reader = response.raw._fp.fp
    buffered: bytes = reader.peek()
    return reader.read(len(buffered)) if buffered else b""


async def pump(attached: Any, stdin: bytes | None, out: CappedOutput) -> None:
    """Feed ``stdin`` (if any) and demultiplex the output into ``out`` until end of stream.

    ``out`` keeps what arrived if the caller cancels or times out.

    Args:
        attached: what ``exec_start(socket=True)`` returned; read by nobody else, and left
            non-blocking.
        stdin: bytes for the command's standard input, or ``None`` when stdin is not attached.
        out: where the output goes.
    """
    sock = raw_socket(attached)
    sock.setblocking(False)
    frames = _Frames(out)
    frames.feed(memoryview(read_ahead(attached)))
    async with anyio.create_task_group() as tg:
        if stdin is not None:
            tg.start_soon(_send_all, sock, stdin)
        await _receive(sock, frames)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[sock.send(view[:_SEND_BYTES]) :]
            except WOULD_BLOCK:
                await anyio.wait_writable(sock)
        sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited without reading all of its input, like a closed pipe


class _Frames:
    """Incremental parser of the multiplexed stream, feeding payloads to a ``CappedOutput``
    (stream 1 to ``stdout``, 2 to ``stderr``; other stream ids are ignored)."""

    def __init__(self, out: CappedOutput) -> None:
        self.out = out
        self.sink: CappedBuffer | None = None
        self.header = bytearray()
        self.remaining = 0  # payload bytes still due for the current frame

    def _sink(self, stream: int) -> CappedBuffer | None:
        if stream == _STDOUT:
            return self.out.stdout
        if stream == _STDERR:
            return self.out.stderr
        return None

    def feed(self, view: memoryview) -> None:
        while view:
            if self.remaining:
                take = min(self.remaining, len(view))
                if self.sink is not None:
                    self.sink.feed(view[:take])
                self.remaining -= take
                view = view[take:]
                continue
            take = _HEADER_BYTES - len(self.header)
            self.header += view[:take]
            view = view[take:]
            if len(self.header) == _HEADER_BYTES:
                self.sink = self._sink(self.header[0])
                self.remaining = int.from_bytes(self.header[4:8], "big")
                self.header.clear()


async def _receive(sock: socket.socket, frames: _Frames) -> None:
    buf = bytearray(_RECV_BYTES)
    while True:
        try:
            n = sock.recv_into(buf)
        except WOULD_BLOCK:
            await anyio.wait_readable(sock)
            continue
        except ConnectionResetError:
            return
        if n == 0:
            return
        frames.feed(memoryview(buf)[:n])
