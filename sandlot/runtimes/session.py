"""``BashSession``: a long-lived shell in a sandbox, where ``cd``, ``export``, virtualenvs and
background jobs persist from one command to the next.

Get one with ``await sandbox.shell(name)``; a sandbox may have several, and closing the sandbox
closes them. Two implementations share this interface:

* :class:`~sandlot.runtimes.channel_session.ChannelSession`: one bash process per session,
  reached through a backend's :class:`~sandlot.runtimes.channel.Channel` (``local``: a
  long-lived bubblewrap jail). Everything below holds.
* :class:`~sandlot.runtimes.exec_session.ExecSession`: the fallback for backends without a
  streaming channel, one ``exec`` per command; only the working directory and exported
  variables persist (see its docstring for what else differs).
"""

from __future__ import annotations

import abc
from types import TracebackType

import anyio
from pydantic import BaseModel, ConfigDict, Field

from sandlot.errors import SandboxError
from sandlot.runtimes.observation import Observation
from sandlot.runtimes.output import DEFAULT_MAX_OUTPUT_CHARS


class SessionClosedError(SandboxError):
    """``run`` was called on a session that was closed (directly or by closing its sandbox)."""


class SessionConfig(BaseModel):
    """Settings of one shell session.

    Attributes:
        cwd: starting directory in the sandbox; ``None`` is the sandbox's ``spec.workdir``.
        env: variables exported at start, after the session defaults (``PAGER=cat``, ...; see
            :data:`sandlot.runtimes.protocol.SESSION_ENV`), which they override.
        startup: commands run once when the shell starts (and restarts), at top level, e.g.
            ``source /opt/venv/bin/activate``.
        max_output_chars: cap in characters on ``Observation.output``; the first and last
            halves are kept around a truncation note.
        interrupt_grace_s: seconds each step of stopping a command waits (SIGINT twice, then
            SIGTERM, then SIGKILL) before escalating; after the last step the shell is
            replaced.
        start_timeout_s: seconds the shell may take to start (including ``startup``), and a
            command that is being stopped to start (see :mod:`~sandlot.runtimes.channel_session`).
    """

    model_config = ConfigDict(extra="forbid")

    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    startup: list[str] = Field(default_factory=list)
    max_output_chars: int = Field(default=DEFAULT_MAX_OUTPUT_CHARS, ge=100)
    interrupt_grace_s: float = Field(default=1.0, gt=0)
    start_timeout_s: float = Field(default=60.0, gt=0)


class BashSession(abc.ABC):
    """One shell of a sandbox. Commands run one at a time; concurrent ``run`` calls queue.

    Args:
        name: the session's name within its sandbox.
        config: its :class:`SessionConfig`.
    """

    def __init__(self, name: str, config: SessionConfig) -> None:
        self.name = name
        self.config = config
        self._lock = anyio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` was called."""
        return self._closed

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Observation:
        """Run ``command`` (any bash: several lines, here-documents, functions) in the shell.

        Args:
            command: the bash code; its standard input is ``/dev/null``.
            timeout: seconds until the command is stopped; ``None`` for no limit. Stopping
                sends SIGINT (like Ctrl-C) and escalates to SIGTERM and SIGKILL of the
                command's processes; the shell keeps its state and the output printed so far
                is returned with ``timed_out=True``.
            idle_timeout: seconds without any output after which the command is stopped the
                same way; ``None`` for no limit.

        Returns:
            The :class:`Observation`; a failing command is a result, not an exception.

        Raises:
            SessionClosedError: the session was closed.
            SandboxDeadError: the sandbox is closed or died.
            SandboxError: the shell could not be started.
            ValueError: a timeout is not positive.
        """
        for label, value in (("timeout", timeout), ("idle_timeout", idle_timeout)):
            if value is not None and value <= 0:
                raise ValueError(f"{label} must be positive, got {value}")
        async with self._lock:
            if self._closed:
                raise SessionClosedError(f"shell session {self.name!r} is closed")
            return await self._run(command, timeout=timeout, idle_timeout=idle_timeout)

    async def interrupt(self) -> None:
        """Stop the running command as a timeout would; its ``run`` returns with
        ``interrupted=True`` and exit code 130. Does nothing when no command runs."""
        if not self._closed:
            await self._interrupt()

    async def close(self) -> None:
        """Stop the shell and every process it started. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._close()

    async def __aenter__(self) -> BashSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def _run(
        self, command: str, *, timeout: float | None, idle_timeout: float | None
    ) -> Observation:
        """Implementation hook of :meth:`run` (arguments checked, lock held, not closed)."""

    @abc.abstractmethod
    async def _interrupt(self) -> None:
        """Implementation hook of :meth:`interrupt`."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Implementation hook of :meth:`close`; must not raise."""

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.name!r} {state}>"
