"""``Channel``: a byte pipe to one long-lived ``bash`` in a sandbox, as a backend provides it.

A channel only moves bytes and delivers signals; the marker protocol, timeouts, interrupts and
output capping live once, in :class:`~sandlot.runtimes.channel_session.ChannelSession`. To give
a backend real sessions, implement a channel and return a ``ChannelSession`` from the backend's
``Sandbox._open_shell``:

* ``local``: :class:`~sandlot.sandboxes.local.local_channel.LocalChannel`, pipes to a ``bash``
  in its own bubblewrap jail;
* a container backend: an attached exec running ``bash`` with stdin open and no TTY; signals go
  through a second exec running ``kill`` (pids below are as the sandbox sees them);
* a remote API with a streamed exec (modal) works the same way.

Processes are named by pid *as the sandbox sees pids*, which is what the shell reports.
"""

from __future__ import annotations

import abc


class Channel(abc.ABC):
    """A running ``bash --noprofile --norc`` reading commands from its standard input.

    Its stdout and stderr come back as one byte stream. ``bootstrap_prelude`` is shell code the
    session runs first in the shell (backend limits and the like).
    """

    bootstrap_prelude: str = ""

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Write ``data`` to the shell's standard input.

        Raises:
            BrokenPipeError: the shell is gone (the session then treats it as exited).
        """

    @abc.abstractmethod
    async def receive(self) -> bytes:
        """The next chunk of the shell's output; ``b""`` once the stream has ended.

        Cancelling a pending ``receive`` must lose no data.
        """

    @abc.abstractmethod
    async def signal_shell(self, sig: int, shell_pid: int) -> None:
        """Send signal ``sig`` to the shell process ``shell_pid``; gone is not an error."""

    @abc.abstractmethod
    async def signal_newer(self, sig: int, newer_than: int) -> None:
        """Send ``sig`` to every process of this shell's session whose pid was allocated after
        ``newer_than``: the processes of the running command. Pids grow within a pid namespace
        up to ``pid_max`` and then start again from the bottom, so "after" counts across that
        wrap-around (up to the namespace's last pid, ``/proc/loadavg``). Processes that exit
        meanwhile are not an error."""

    async def exit_status(self) -> int | None:
        """The shell's exit status (``128 + N`` for signal N) once its output has ended, if the
        channel can tell; waits briefly for the shell to be reaped."""
        return None

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill the shell and every process of its session. Idempotent; never raises."""
