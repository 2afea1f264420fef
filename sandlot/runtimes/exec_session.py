"""``ExecSession``: the generic session for backends without a streaming channel.

Every command is one ``Sandbox.exec`` of a fresh ``bash`` that runs the same protocol script as
a :class:`~sandlot.runtimes.channel_session.ChannelSession` (syntax check, ``set -e``
handling, markers), between a restore and a save of the session state, kept in the sandbox
under ``${TMPDIR:-/tmp}/.sandlot-sessions/``:

* carried over: the working directory and the exported variables (``export -p``; a variable
  unset by a command stays unset), and ``set -e``/``set -x`` are not;
* not carried over: shell variables that are not exported, functions, aliases, options, and
  background jobs (the backend kills them when the ``exec`` ends);
* a timeout is the ``exec``'s own: the command's processes are killed, the output printed so
  far is returned, and the state stays as it was before the command;
* ``idle_timeout`` is not enforced (an ``exec`` streams nothing back until it ends), and
  :meth:`interrupt` cancels the ``exec``, which returns no output;
* a top-level ``exit`` resets the state, like the fresh shell of a ``ChannelSession``.
"""

from __future__ import annotations

import contextlib
import shlex
import time
import uuid
from typing import Protocol

import anyio

from sandlot.errors import SandboxError
from sandlot.result import TIMEOUT_EXIT_CODE, ExecResult
from sandlot.runtimes.observation import INTERRUPTED_EXIT_CODE, SYNTAX_ERROR_EXIT_CODE, Observation
from sandlot.runtimes.output import OutputBuffer
from sandlot.runtimes.protocol import (
    Marker,
    MarkerScanner,
    bootstrap_script,
    command_script,
    new_nonce,
)
from sandlot.runtimes.session import BashSession, SessionConfig


class OneShotExec(Protocol):
    """What an :class:`ExecSession` needs of its sandbox (a ``Sandbox`` is one): one-shot
    ``exec`` and whether the sandbox is closed. Typed here so that ``runtimes/`` knows nothing
    of ``sandboxes/``."""

    @property
    def closed(self) -> bool: ...

    async def exec(
        self, cmd: str, *, timeout: float | None = ..., cwd: str | None = ...
    ) -> ExecResult: ...


_STATE_ROOT = '"${TMPDIR:-/tmp}/.sandlot-sessions"'

_RESTORE = """\
if [[ -f "$__sandlot_state/env" ]]; then
  builtin cd -- "$(< "$__sandlot_state/cwd")" 2>/dev/null
  for __sandlot_v in $(compgen -e); do builtin unset -v "$__sandlot_v" 2>/dev/null; done
  . "$__sandlot_state/env" 2>/dev/null
fi
"""

_SAVE = """\
{ command mkdir -p -- "$__sandlot_state"
  builtin printf '%s' "$PWD" >"$__sandlot_state/cwd"
  builtin export -p >"$__sandlot_state/env"; } 2>/dev/null
"""


class ExecSession(BashSession):
    """A session emulated with one-shot ``exec`` calls (see the module docstring).

    Args:
        name: session name.
        config: session settings (``interrupt_grace_s`` and ``start_timeout_s`` are unused).
        sandbox: the sandbox whose ``exec`` runs the commands.
        workdir: absolute directory in the sandbox where commands start unless ``config.cwd``.
    """

    def __init__(
        self, name: str, config: SessionConfig, sandbox: OneShotExec, workdir: str
    ) -> None:
        super().__init__(name, config)
        self._sandbox = sandbox
        self._workdir = workdir
        self._state_id = uuid.uuid4().hex
        self._stale_state: str | None = None
        self._scope: anyio.CancelScope | None = None

    def _script(self, command: str, boot_nonce: str, nonce: str) -> str:
        state = f"{_STATE_ROOT}/{self._state_id}"
        lines = [
            bootstrap_script(boot_nonce, env=self.config.env, startup=self.config.startup).decode(
                "utf-8", "surrogateescape"
            ),
            f"__sandlot_state={state}",
        ]
        if self._stale_state is not None:
            lines.append(f"command rm -rf -- {_STATE_ROOT}/{shlex.quote(self._stale_state)}")
        lines += [
            _RESTORE,
            command_script(command, nonce).decode("utf-8", "surrogateescape"),
            _SAVE,
        ]
        return "\n".join(lines)

    async def _run(
        self, command: str, *, timeout: float | None, idle_timeout: float | None
    ) -> Observation:
        started = time.perf_counter()
        boot_nonce, nonce = new_nonce(), new_nonce()
        try:
            script = self._script(command, boot_nonce, nonce)
        except ValueError as exc:
            return Observation(output=f"{exc}\n", exit_code=SYNTAX_ERROR_EXIT_CODE)
        result = None
        with anyio.CancelScope() as self._scope:
            result = await self._sandbox.exec(
                script, timeout=timeout, cwd=self.config.cwd or self._workdir
            )
        self._scope = None
        if result is None:  # interrupted
            return Observation(
                output="",
                exit_code=INTERRUPTED_EXIT_CODE,
                interrupted=True,
                duration_s=time.perf_counter() - started,
            )
        boot, run = MarkerScanner(boot_nonce), MarkerScanner(nonce)
        out = OutputBuffer(self.config.max_output_chars)
        end: Marker | None = None
        booted = False
        for item in [*boot.feed(result.stdout.encode("utf-8", "surrogateescape")), boot.flush()]:
            if isinstance(item, Marker):
                booted = booted or item.kind == "R"
            elif booted:
                for sub in run.feed(item):
                    if isinstance(sub, Marker):
                        end = sub if sub.kind in ("E", "X") else end
                    elif end is None:
                        out.feed(sub)
        if end is None:
            out.feed(run.flush())
        if not booted and not result.timed_out:
            raise SandboxError(
                f"shell session {self.name!r}: the shell did not start: "
                f"{(result.stdout + result.stderr)[-2000:]}"
            )
        restarted = end is not None and end.kind == "X"
        if restarted:
            self._stale_state, self._state_id = self._state_id, uuid.uuid4().hex
        text, truncated = out.text()
        return Observation(
            output=text,
            exit_code=TIMEOUT_EXIT_CODE
            if result.timed_out
            else (end.values[0] if end is not None else result.exit_code),
            timed_out=result.timed_out,
            interrupted=result.timed_out,
            truncated=truncated or result.truncated,
            duration_s=time.perf_counter() - started,
            shell_restarted=restarted,
        )

    async def _interrupt(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def _close(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        if not self._sandbox.closed:
            with contextlib.suppress(SandboxError), anyio.move_on_after(10):
                await self._sandbox.exec(
                    f"rm -rf -- {_STATE_ROOT}/{shlex.quote(self._state_id)}", timeout=10
                )
