"""Run one host process to completion: capped output, timeout, and process-group kill.

Everything the ``local`` backend starts goes through :func:`run_process`. The process is the
leader of a new session (so of its own process group); at a timeout, on cancellation, or when
the sandbox closes, that whole group is sent SIGKILL. Under bubblewrap the group is ``bwrap``
itself, and its ``--die-with-parent``/``--unshare-pid`` take the rest of the jail down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from sandlot.sandboxes.capped import CappedBuffer

_CHUNK = 64 * 1024
# Once the process has exited, its pipes normally reach EOF within milliseconds. A process that
# escaped the group (only possible without a PID namespace) may hold them open forever; stop
# reading after this long.
_DRAIN_GRACE_S = 1.0
# Upper bound for reaping a process that was just sent SIGKILL.
_REAP_BUDGET_S = 10.0


@dataclass(frozen=True)
class Completed:
    """How a process ended.

    Attributes:
        returncode: exit status; ``128 + N`` when killed by signal N (also for a timeout kill).
        stdout: captured standard output (empty when it went to a file).
        stderr: captured standard error.
        stdout_dropped: bytes of stdout read but discarded beyond the cap.
        stderr_dropped: bytes of stderr read but discarded beyond the cap.
        timed_out: the process was killed at its timeout.
        duration_s: wall time from spawn to exit, in seconds.
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int
    timed_out: bool
    duration_s: float


class ProcessGroups:
    """The process groups one sandbox has running, so closing it can kill them all."""

    def __init__(self) -> None:
        self._pgids: set[int] = set()

    def add(self, pgid: int) -> None:
        """Track process group ``pgid``."""
        self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        """Stop tracking ``pgid`` (its leader has been reaped)."""
        self._pgids.discard(pgid)

    def kill_all(self) -> None:
        """Send SIGKILL to every tracked group."""
        for pgid in list(self._pgids):
            kill_group(pgid)


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid``; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _drain(
    stream: anyio.abc.ByteReceiveStream,
    capture: CappedBuffer,
    done: anyio.Event,
    sink: Path | None,
) -> None:
    try:
        if sink is None:
            async for chunk in stream:
                capture.feed(chunk)
        else:
            async with await anyio.open_file(sink, "wb") as out:
                async for chunk in stream:
                    await out.write(chunk)
    finally:
        done.set()


async def _feed(stream: anyio.abc.ByteSendStream, data: bytes | Path) -> None:
    try:
        if isinstance(data, Path):
            async with await anyio.open_file(data, "rb") as src:
                while chunk := await src.read(_CHUNK):
                    await stream.send(chunk)
        elif data:
            await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
        # The process exited (or closed stdin) without reading everything: not our error.
        pass
    finally:
        await stream.aclose()


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    stdin: bytes | Path | None = None,
    timeout: float | None = None,
    max_output_bytes: int | None = None,
    stdout_path: Path | None = None,
    groups: ProcessGroups | None = None,
    kill_group_on_exit: bool = False,
) -> Completed:
    """Run ``argv`` in a new session and wait for it, reading stdout and stderr concurrently.

    Args:
        argv: program and arguments.
        env: the complete environment of the process (nothing is inherited).
        cwd: working directory on the host, or ``None`` for ours.
        stdin: bytes, or a host file streamed in, fed to standard input; ``None`` gives
            ``/dev/null``.
        timeout: seconds until the whole process group is killed; ``None`` waits forever.
        max_output_bytes: per-stream cap in bytes on what is kept; the rest is still read (so
            the process never blocks on a full pipe) and counted in ``*_dropped``.
        stdout_path: write stdout, uncapped, to this host file instead of keeping it.
        groups: registry the process group is added to while it runs.
        kill_group_on_exit: after the leader exits, SIGKILL whatever is left of its group
            (background jobs). Needed when no PID namespace does it for us.

    Returns:
        The :class:`Completed` process.

    Raises:
        OSError: the process could not be spawned.
    """
    started = time.perf_counter()
    process = await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    pgid = process.pid  # a session leader leads its own process group
    if groups is not None:
        groups.add(pgid)
    out, err = CappedBuffer(max_output_bytes), CappedBuffer(max_output_bytes)
    timed_out = False
    try:
        async with anyio.create_task_group() as tg:
            out_done, err_done = anyio.Event(), anyio.Event()
            assert process.stdout is not None and process.stderr is not None
            tg.start_soon(_drain, process.stdout, out, out_done, stdout_path)
            tg.start_soon(_drain, process.stderr, err, err_done, None)
            if stdin is not None:
                assert process.stdin is not None
                tg.start_soon(_feed, process.stdin, stdin)
            with anyio.move_on_after(timeout) as scope:
                await process.wait()
            if scope.cancelled_caught:
                timed_out = True
                kill_group(pgid)
                await process.wait()
            elif kill_group_on_exit:
                # The leader is reaped, but background members keep the group (and so its id)
                # allocated; an empty group's id could in principle be reused in this instant.
                kill_group(pgid)
            with anyio.move_on_after(_DRAIN_GRACE_S):
                await out_done.wait()
                await err_done.wait()
            tg.cancel_scope.cancel()
    except BaseException:
        kill_group(pgid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_REAP_BUDGET_S):
            await process.wait()
        raise
    finally:
        if groups is not None:
            groups.discard(pgid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_REAP_BUDGET_S):
            await process.aclose()
    assert process.returncode is not None
    return Completed(
        returncode=128 + signal.SIGKILL if timed_out else _exit_status(process.returncode),
        stdout=bytes(out),
        stderr=bytes(err),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
    )
