"""Our end of the ``SOCK_SEQPACKET`` socket pair to a process we run: a sandbox's init
(:mod:`sandlot.sandboxes.local.init_client`) or a zygote
(:mod:`sandlot.sandboxes.local.zygote_client`). One packet per message, fields separated by
NUL bytes, file descriptors attached with ``SCM_RIGHTS``."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Protocol

import anyio

from sandlot.errors import SandlotError

_MAX_PACKET = 64 * 1024


class InitDied(SandlotError):
    """The init (or the zygote) is gone: the sandbox's processes are all dead."""


class HostProcess(Protocol):
    """The host process whose death ends a sandbox: ``bwrap``, or the init itself."""

    @property
    def pid(self) -> int:
        """Its pid on the host."""

    def poll(self) -> int | None:
        """``None`` until it has exited and been reaped."""

    def kill(self) -> None:
        """SIGKILL it (and, for ``bwrap``, its session). Never raises."""

    async def wait(self, within_s: float) -> None:
        """Return once it has been reaped, or after ``within_s`` seconds. Never raises."""


class Peer:
    """The socket to ``process``, non-blocking; ``name`` says who it is in errors
    (``"the sandbox's init"``).

    Attributes:
        dead: the connection broke (or :meth:`close` was called).
    """

    def __init__(self, sock: socket.socket, process: HostProcess, name: str) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.process = process
        self.name = name
        self.dead = False

    @property
    def alive(self) -> bool:
        """``True`` until the connection broke or the process exited."""
        if self.dead or self.process.poll() is not None:
            return False
        try:  # the peer's end closes when it exits, before bwrap is reaped
            if self.sock.recv(1, socket.MSG_PEEK) == b"":
                self.dead = True
        except BlockingIOError:
            pass
        except OSError:
            self.dead = True
        return not self.dead

    async def receive(self) -> list[bytes]:
        """The next message's fields.

        Raises:
            InitDied: the peer is gone.
        """
        while True:
            try:
                data = self.sock.recv(_MAX_PACKET)
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            except OSError:
                data = b""
            if not data:
                self.dead = True
                raise InitDied(f"{self.name} exited")
            return data.split(b"\0")

    async def send(self, fields: Sequence[bytes], fds: Sequence[int] = ()) -> None:
        """Send one message with ``fds`` attached (duplicated into the peer).

        Raises:
            InitDied: the peer is gone.
        """
        message = b"\0".join(fields)
        while True:
            if self.dead:
                raise InitDied(f"{self.name} exited")
            try:
                if fds:
                    socket.send_fds(self.sock, [message], list(fds))
                else:
                    self.sock.send(message)
                return
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
            except OSError as exc:
                self.dead = True
                raise InitDied(f"{self.name} is gone: {exc}") from exc

    def close(self) -> None:
        """Close the socket; the peer sees end of file."""
        self.dead = True
        self.sock.close()
