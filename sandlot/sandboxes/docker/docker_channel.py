"""``DockerChannel``: the ``docker`` backend's session channel, an attached exec running bash.

The shell is ``exec_create(stdin=True, tty=False)`` + ``exec_start(socket=True)`` (Docker
Engine API v1.41, also served by Podman), started by the sandbox: commands go down the hijacked
connection, output comes back multiplexed in 8-byte-header frames (stdout and stderr are merged
by the shell anyway; see :mod:`sandlot.sandboxes.docker.stream`).

Every process of the session carries ``SANDLOT_EXEC_ID=<session marker>`` in its environment
(set on the exec, inherited by everything it starts), the container backends' exec marker (see
:mod:`sandlot.sandboxes.remote_shell`): signals go through a second exec that scans
``/proc/*/environ`` for it, and closing the session runs the backends' killer for that marker.
Without a TTY the stream ends only when every process holding the shell's output has exited, so
a shell that ends without a marker (``exec``, killed from outside) while a background job lives
is noticed at the command's timeout instead.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from sandlot.sandboxes.docker.engine import run_blocking
from sandlot.sandboxes.docker.stream import Attached
from sandlot.sandboxes.remote_channel import RemoteShellChannel, Runner

if TYPE_CHECKING:
    from docker import APIClient


class DockerChannel(RemoteShellChannel):
    """The attached exec ``exec_id`` running a session's ``bash`` (``remote_shell.shell_argv``),
    every process of which carries ``SANDLOT_EXEC_ID=marker``; ``run`` is the sandbox's
    ``exec``, which delivers signals."""

    sweep_orphans = True  # PID 1 is sandlot's init (remote_shell.init_argv)

    def __init__(
        self, api: APIClient, exec_id: str, attached: Attached, marker: str, run: Runner
    ) -> None:
        super().__init__(marker, run)
        self._api = api
        self._exec_id = exec_id
        self._attached = attached

    async def send(self, data: bytes) -> None:
        await self._attached.send(data)

    async def receive(self) -> bytes:
        # The shell's stdout and stderr alike: it merges them anyway.
        return b"".join(piece for _, piece in await self._attached.receive())

    async def exit_status(self) -> int | None:
        # None also when the engine already forgot the exec (Podman, exit_command_delay = 0).
        with contextlib.suppress(Exception):
            info = await run_blocking(self._api.exec_inspect, self._exec_id)
            code = info.get("ExitCode")
            return None if info.get("Running") or code is None else int(code)
        return None

    async def _release(self) -> None:
        with contextlib.suppress(OSError):
            self._attached.close()
