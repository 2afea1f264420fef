"""``ChannelSession``: a :class:`BashSession` over a backend :class:`Channel`.

Everything that is not moving bytes lives here, once for every backend: the marker protocol
(:mod:`sandlot.runtimes.protocol`), exit codes, timeouts and the idle timeout, interrupts and
their escalation, output capping, and restarting a shell that ended.

Stopping a command (timeout, idle timeout, :meth:`interrupt`) walks :data:`ESCALATION`, waiting
``SessionConfig.interrupt_grace_s`` after each step for the command to end:

1. SIGINT to the shell (its trap ends the command) and to the command's processes, i.e. the
   processes newer than the command's fence (see the protocol); background jobs of earlier
   commands are older, so they are spared;
2. SIGINT again (a trap may have ended only a function of the command);
3. SIGTERM to the command's processes, then 4. SIGKILL to them (background jobs started by
   this same command included).

The shell keeps its state throughout. If the command still has not ended, the shell is killed
and the next command starts a fresh one (``shell_restarted=True``). The escalation begins at
the command's ``S`` marker, when the shell's traps are armed: a signal sent while the shell
still reads and checks the command text would be ignored, or end the shell. A command whose
marker has not come ``SessionConfig.start_timeout_s`` after the stop began is given up the
same way.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable

import anyio

from sandlot.errors import SandboxDeadError, SandboxError
from sandlot.result import TIMEOUT_EXIT_CODE
from sandlot.runtimes.channel import Channel
from sandlot.runtimes.observation import INTERRUPTED_EXIT_CODE, SYNTAX_ERROR_EXIT_CODE, Observation
from sandlot.runtimes.output import OutputBuffer
from sandlot.runtimes.protocol import (
    Marker,
    MarkerScanner,
    bootstrap_script,
    command_script,
    new_nonce,
)
from sandlot.runtimes.session import BashSession, SessionClosedError, SessionConfig

log = logging.getLogger("sandlot.runtimes")

ESCALATION: tuple[signal.Signals, ...] = (
    signal.SIGINT,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGKILL,
)
"""Signals sent, one per grace period, to stop a command (see the module docstring)."""

_START_ATTEMPTS = 3
_ERROR_TAIL_CHARS = 2000
_SEND_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)

ChannelOpener = Callable[[], Awaitable[Channel]]
"""Starts a new shell and returns its channel (called again after the shell ended)."""


class _ShellGone(Exception):
    """The shell's output ended before the expected marker."""

    def __init__(self, output: bytes) -> None:
        super().__init__("the shell's output ended")
        self.output = output


class ChannelSession(BashSession):
    """A shell session whose bash runs behind a :class:`Channel`.

    Args:
        name: session name.
        config: session settings.
        open_channel: starts a shell and returns its channel.
        sandbox_alive: tells whether the sandbox still lives, asked when a shell ends
            unexpectedly (a dead sandbox raises ``SandboxDeadError`` instead of restarting).
    """

    def __init__(
        self,
        name: str,
        config: SessionConfig,
        open_channel: ChannelOpener,
        sandbox_alive: Callable[[], Awaitable[bool]],
    ) -> None:
        super().__init__(name, config)
        self._open_channel = open_channel
        self._sandbox_alive = sandbox_alive
        self._channel: Channel | None = None
        self._shell_pid = 0
        self._leftover = b""
        self._stop_requested = False
        self._wake: anyio.CancelScope | None = None

    # ----------------------------------------------------------------- shell lifecycle

    async def _start_shell(self) -> Channel:
        problem = ""
        for attempt in range(1, _START_ATTEMPTS + 1):
            channel = await self._open_channel()
            try:
                with anyio.fail_after(self.config.start_timeout_s):
                    self._shell_pid = await self._bootstrap(channel)
                return channel
            except _ShellGone as exc:
                problem = exc.output.decode("utf-8", "replace").strip()[-_ERROR_TAIL_CHARS:]
            except TimeoutError:
                await channel.close()
                raise SandboxError(
                    f"shell session {self.name!r} did not start within "
                    f"{self.config.start_timeout_s} s (check SessionConfig.startup)",
                    retryable=True,
                ) from None
            except BaseException:
                await channel.close()
                raise
            await channel.close()
            if not await self._sandbox_alive():
                raise SandboxDeadError(f"the sandbox died while starting shell {self.name!r}")
            # e.g. bubblewrap failing on a changing mount table: starting again is safe.
            log.debug("shell %r failed to start (attempt %d): %s", self.name, attempt, problem)
        raise SandboxError(
            f"shell session {self.name!r} could not start: {problem or 'no output'}",
            retryable=True,
        )

    async def _bootstrap(self, channel: Channel) -> int:
        nonce = new_nonce()
        script = bootstrap_script(
            nonce,
            prelude=channel.bootstrap_prelude,
            env=self.config.env,
            startup=self.config.startup,
        )
        scanner = MarkerScanner(nonce)
        seen = bytearray()
        with contextlib.suppress(*_SEND_ERRORS):  # if the shell is gone, its output says why
            await channel.send(script)
        while True:
            chunk = await channel.receive()
            if not chunk:
                raise _ShellGone(bytes(seen) + scanner.flush())
            for item in scanner.feed(chunk):
                if isinstance(item, Marker):
                    if item.kind == "R":
                        if seen:
                            log.debug("shell %r startup output: %r", self.name, bytes(seen))
                        return item.values[0]
                elif len(seen) < 64 * 1024:
                    seen += item

    async def _drop_shell(self) -> None:
        channel, self._channel = self._channel, None
        self._leftover = b""
        if channel is not None:
            await channel.close()

    async def _close(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
        await self._drop_shell()

    async def _interrupt(self) -> None:
        self._stop_requested = True
        if self._wake is not None:
            self._wake.cancel()

    # ----------------------------------------------------------------- running

    async def _run(
        self, command: str, *, timeout: float | None, idle_timeout: float | None
    ) -> Observation:
        started = time.perf_counter()
        self._stop_requested = False
        nonce = new_nonce()
        try:
            script = command_script(command, nonce)
        except ValueError as exc:
            return Observation(output=f"{exc}\n", exit_code=SYNTAX_ERROR_EXIT_CODE)
        if self._channel is None:
            self._channel = await self._start_shell()
        try:
            return await self._converse(
                self._channel, script, nonce, timeout, idle_timeout, started
            )
        except BaseException:
            # Cancelled (or failed) mid-command: the shell's state is unknown, so replace it.
            with anyio.CancelScope(shield=True):
                await self._drop_shell()
            raise

    async def _converse(
        self,
        channel: Channel,
        script: bytes,
        nonce: str,
        timeout: float | None,
        idle_timeout: float | None,
        started: float,
    ) -> Observation:
        scanner = MarkerScanner(nonce)
        out = OutputBuffer(self.config.max_output_chars)
        out.feed(self._leftover)
        self._leftover = b""
        now = anyio.current_time()
        deadline = now + timeout if timeout is not None else math.inf
        idle_at = now + idle_timeout if idle_timeout is not None else math.inf
        reason: str | None = None  # "timeout" or "interrupt" once stopping
        step, step_at, give_up_at = 0, math.inf, math.inf
        fence: int | None = None
        end: Marker | None = None
        gone = False
        with contextlib.suppress(*_SEND_ERRORS):
            await channel.send(script)
        while end is None and not gone:
            now = anyio.current_time()
            if reason is None and (self._stop_requested or now >= min(deadline, idle_at)):
                reason = "interrupt" if self._stop_requested else "timeout"
                step_at, give_up_at = now, now + self.config.start_timeout_s
            if reason is not None and now >= step_at:
                if step == len(ESCALATION) or (fence is None and now >= give_up_at):
                    break  # nothing stopped it: give the shell up
                if fence is None:  # not started yet: the S marker resumes the escalation
                    step_at = give_up_at
                else:
                    await self._signal(channel, ESCALATION[step], fence)
                    step += 1
                    step_at = now + self.config.interrupt_grace_s
            wake_at = step_at if reason is not None else min(deadline, idle_at)
            chunk: bytes | None = None
            with anyio.CancelScope(deadline=wake_at) as self._wake:
                chunk = await channel.receive()
            self._wake = None
            if self._closed:
                raise SessionClosedError(f"shell session {self.name!r} was closed")
            if chunk is None:  # woken by a deadline or interrupt(): nothing was read
                continue
            if not chunk:
                gone = True
                break
            if idle_timeout is not None:
                idle_at = anyio.current_time() + idle_timeout
            for item in scanner.feed(chunk):
                if end is not None:
                    if isinstance(item, bytes):
                        self._leftover += item
                elif isinstance(item, Marker):
                    if item.kind == "S":
                        fence = item.values[0]
                        if reason is not None:
                            step_at = anyio.current_time()
                    elif item.kind in ("E", "X"):
                        end = item
                else:
                    out.feed(item)
        if end is not None and end.kind == "E":
            self._leftover += scanner.flush()
        else:
            out.feed(scanner.flush())
        restarted = end is None or end.kind == "X"
        if gone and not await self._sandbox_alive():
            await self._drop_shell()
            raise SandboxDeadError(f"the sandbox died while shell {self.name!r} ran a command")
        if end is not None:
            exit_code = end.values[0]
        else:
            status = await channel.exit_status()
            exit_code = status if status is not None else 1
        if restarted:
            await self._drop_shell()
        stopped = step > 0 or (reason is not None and end is None)
        if stopped:
            exit_code = TIMEOUT_EXIT_CODE if reason == "timeout" else INTERRUPTED_EXIT_CODE
        text, truncated = out.text()
        return Observation(
            output=text,
            exit_code=exit_code,
            timed_out=stopped and reason == "timeout",
            interrupted=stopped,
            truncated=truncated,
            duration_s=time.perf_counter() - started,
            shell_restarted=restarted,
        )

    async def _signal(self, channel: Channel, sig: signal.Signals, fence: int) -> None:
        log.debug("shell %r: sending %s (fence %s)", self.name, sig.name, fence)
        if sig == signal.SIGINT:
            await channel.signal_shell(sig, self._shell_pid)
        await channel.signal_newer(sig, fence)
