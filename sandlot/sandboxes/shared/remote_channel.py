"""What the session channels of the container backends (``docker``, ``modal``) share: their
shell carries an exec marker (:data:`~sandlot.sandboxes.shared.remote_shell.EXEC_MARKER_ENV`), and
signals reach it and its children through one-shot execs in the same sandbox."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sandlot.runtimes.channel import Channel
from sandlot.sandboxes.shared import remote_shell

_SIGNAL_TIMEOUT_S = 30.0

Runner = Callable[[list[str]], Awaitable[Any]]
"""Runs a one-shot argv in the same sandbox (the sandbox's ``exec``)."""


class RemoteShellChannel(Channel):
    """A :class:`Channel` whose shell was started with ``SANDLOT_EXEC_ID=marker``; ``run``
    delivers its signals.

    Args:
        marker: the shell's exec marker.
        run: the sandbox's ``exec``.
    """

    kill_grace_s: float = 0.5
    """Seconds between SIGTERM and SIGKILL when the channel closes."""
    sweep_orphans: bool = False
    """Closing also kills unmarked orphans (``remote_shell.kill_argv``): only where PID 1 is
    sandlot's init and the sandbox runs nothing else."""

    def __init__(self, marker: str, run: Runner) -> None:
        self._marker = marker
        self._run = run
        self._closed = False

    async def _release(self) -> None:
        """Let go of the transport's side of the shell (its streams); must not raise."""

    async def close(self) -> None:
        """Once, shielded: :meth:`_release`, then kill the shell and everything it started."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._release()
            await self._kill_all(self.kill_grace_s, sweep_orphans=self.sweep_orphans)

    async def _signal(self, argv: list[str]) -> None:
        """Run ``argv`` for at most 30 s; never raises (the shell may already be gone)."""
        with anyio.move_on_after(_SIGNAL_TIMEOUT_S), contextlib.suppress(Exception):
            await self._run(argv)

    async def signal_shell(self, sig: int, shell_pid: int) -> None:
        await self._signal(["kill", "-s", signal.Signals(sig).name[3:], str(shell_pid)])

    async def signal_newer(self, sig: int, newer_than: int) -> None:
        name = signal.Signals(sig).name[3:]
        await self._signal(remote_shell.signal_newer_argv(self._marker, name, newer_than))

    async def _kill_all(self, grace_s: float, *, sweep_orphans: bool = False) -> None:
        """Kill the shell and everything it started (SIGTERM, ``grace_s`` s, SIGKILL)."""
        await self._signal(
            remote_shell.kill_argv(self._marker, grace_s, sweep_orphans=sweep_orphans)
        )
