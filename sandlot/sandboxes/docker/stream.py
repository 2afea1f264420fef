"""An exec's hijacked connection, written and read asynchronously, without a thread.

``exec_start(socket=True)`` hands over the hijacked HTTP connection. Without a TTY the engine
frames the output as described in the Docker Engine API (v1.41, "Attach to a container",
https://docs.docker.com/engine/api/v1.41/#tag/Container/operation/ContainerAttach): an 8-byte
header ``[stream, 0, 0, 0, size (uint32 big-endian)]`` followed by ``size`` bytes, stream 1 being
stdout and 2 stderr. Standard input is written to the same connection and ended by a write
half-close. The SDK's own demultiplexer (``docker.utils.socket.frames_iter``) reads a blocking
socket, which would hold a worker thread for as long as a command runs.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import struct
from typing import Any

import anyio

from sandlot.sandboxes.capped import CappedBuffer, CappedOutput

_RECV_BYTES = 256 * 1024
_SEND_BYTES = 64 * 1024
_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2
# The wrapper's last line: "<secret> <status>\n" (remote_shell.exec_argv(report_status=True)).
_STATUS = re.compile(rb" ([0-9]{1,3})\n")
# Errors of a non-blocking socket call that mean "try again" (TLS engines raise the SSL ones).
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Attached:
    """What ``exec_start(socket=True)`` returned (read by nobody else), made non-blocking.

    docker 7.1 returns a ``socket.SocketIO`` for unix:// and tcp:// and the ``SSLSocket`` itself
    for TLS.
    """

    def __init__(self, attached: Any) -> None:
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

    async def send(self, data: bytes, *, end: bool = False) -> None:
        """Write ``data`` to the command's stdin; ``end`` closes stdin after it."""
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view[:_SEND_BYTES]) :]
            except _WOULD_BLOCK:
                await anyio.wait_writable(self._sock)
        if end:
            self._sock.shutdown(socket.SHUT_WR)

    async def receive(self) -> list[tuple[int, bytes]]:
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


async def pump(
    attached: Attached, secret: bytes, stdin: bytes | None, out: CappedOutput
) -> int | None:
    """Send the wrapper's secret line and ``stdin``, and demultiplex the output into ``out``
    until its end. ``out`` keeps what arrived if the caller cancels or times out.

    Args:
        attached: the exec's connection.
        secret: the wrapper's secret (see ``remote_shell.exec_argv(report_status=True)``).
        stdin: the command's standard input, ended after it (a write half-close); ``None``
            leaves the exec's stdin open, for a wrapper that gives the command ``/dev/null``
            (``exec_argv(stdin=False)``): a TLS socket cannot half-close and still read.
        out: where the output goes (stdout without the wrapper's status line).

    Returns:
        The exit status from the ``<secret> <status>`` line that ends stdout, ``None`` when
        stdout does not end with one (the wrapper was killed, or its line was tampered with).
    """
    tail = _StatusTail(out.stdout, secret)

    async def feed() -> None:
        # The command may exit without reading all of its input, like a closed pipe.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await attached.send(secret + b"\n" + (stdin or b""), end=stdin is not None)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            while pieces := await attached.receive():
                for stream, data in pieces:
                    if stream == _STDOUT:
                        tail.feed(data)
                    elif stream == _STDERR:
                        out.stderr.feed(data)
    finally:
        code = tail.end()  # also on a timeout or cancellation: what arrived is kept
    return code


class _StatusTail:
    """Passes stdout on to ``sink`` but for its last bytes, which may be the status line."""

    def __init__(self, sink: CappedBuffer, secret: bytes) -> None:
        self.sink = sink
        self.secret = secret
        self.keep = len(secret) + len(b" 255\n")
        self.held = b""

    def feed(self, data: bytes) -> None:
        held = self.held + data
        self.sink.feed(held[: -self.keep])
        self.held = held[-self.keep :]

    def end(self) -> int | None:
        at = self.held.rfind(self.secret)
        line = _STATUS.fullmatch(self.held, at + len(self.secret)) if at >= 0 else None
        self.sink.feed(self.held[:at] if line else self.held)
        return int(line[1]) if line else None
