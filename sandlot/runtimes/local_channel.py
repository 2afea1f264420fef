"""``LocalChannel``: the ``local`` backend's session channel, a ``bash`` behind pipes.

With ``isolation="bwrap"`` the shell runs in its own bubblewrap jail, built like the jail of a
one-shot ``exec`` (same image, workdir, ``/tmp`` and ``$HOME``), so files are shared with the
sandbox, while the jail's PID namespace holds exactly this session's processes: background
jobs live as long as the session and die with it. Signals are sent from the host to the host
pids of the jail's processes, found in ``/proc`` by their namespace pids. With
``isolation="none"`` the shell is a plain host process in its own session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import anyio.abc

from sandlot.runtimes.channel import Channel
from sandlot.runtimes.procfs import descendants, nspid_of
from sandlot.sandboxes.local.process import ProcessGroups, kill_group

_CHUNK = 64 * 1024
_REAP_BUDGET_S = 5.0


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class LocalChannel(Channel):
    """Pipes to one ``bash`` process (or the ``bwrap`` jail running it) on this host.

    Use :meth:`start`. Its stderr is merged into stdout at the pipe.
    """

    def __init__(self, process: anyio.abc.Process, prelude: str, groups: ProcessGroups) -> None:
        self._process = process
        self.bootstrap_prelude = prelude
        self._groups = groups
        self._shell_host_pid: int | None = None
        self._closed = False

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None,
        prelude: str,
        groups: ProcessGroups,
    ) -> LocalChannel:
        """Spawn ``argv`` (which must end in ``bash --noprofile --norc``) as a session leader.

        Args:
            argv: the bwrap command line ending in the shell, or the bare shell.
            env: its complete environment.
            cwd: host working directory of the process (``None`` when bwrap sets it).
            prelude: shell code run first in the shell (the sandbox's limits).
            groups: the sandbox's process groups; the channel's group is tracked there so that
                closing the sandbox kills it.

        Raises:
            OSError: the process could not be spawned.
        """
        process = await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        groups.add(process.pid)
        return cls(process, prelude, groups)

    async def send(self, data: bytes) -> None:
        assert self._process.stdin is not None
        await self._process.stdin.send(data)

    async def receive(self) -> bytes:
        assert self._process.stdout is not None
        try:
            return await self._process.stdout.receive(_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return b""

    async def _host_pid(self, shell_pid: int) -> int | None:
        if self._shell_host_pid is None:
            root = self._process.pid
            if nspid_of(root) == shell_pid:
                self._shell_host_pid = root  # no jail: the shell is our child
            else:
                procs = await anyio.to_thread.run_sync(descendants, root)
                self._shell_host_pid = next((p.pid for p in procs if p.nspid == shell_pid), None)
        return self._shell_host_pid

    async def signal_shell(self, sig: int, shell_pid: int) -> None:
        host_pid = await self._host_pid(shell_pid)
        if host_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(host_pid, sig)

    async def signal_newer(self, sig: int, newer_than: int) -> None:
        for proc in await anyio.to_thread.run_sync(descendants, self._process.pid):
            if proc.nspid > newer_than:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, sig)

    async def exit_status(self) -> int | None:
        with anyio.move_on_after(1.0):
            await self._process.wait()
        code = self._process.returncode
        return None if code is None else _exit_status(code)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pid = self._process.pid
        with anyio.CancelScope(shield=True):
            # Processes that left the shell's group (setsid) are found before the shell dies,
            # while they are still its descendants; under bwrap they die with the jail anyway.
            stragglers = await anyio.to_thread.run_sync(descendants, pid)
            kill_group(pid)
            for proc in stragglers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)
            with anyio.move_on_after(_REAP_BUDGET_S):
                await self._process.wait()
            with anyio.move_on_after(_REAP_BUDGET_S):
                await self._process.aclose()
            self._groups.discard(pid)
