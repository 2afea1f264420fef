"""Run one command through a sandbox's init: capped output, stdin, timeout, tree kill.

The command's stdout and stderr are pipes we read here (or, for stdout, a host file the
command writes directly); stdin is a pipe fed from bytes, a host file, or ``/dev/null``. When
the command's own process exits, whatever it wrote is already in the pipes: it is read and the
pipes are closed. Background processes it left keep running (until the sandbox closes), but
their later output is not collected, as with ``docker exec``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from sandlot.sandboxes.capped import CappedBuffer
from sandlot.sandboxes.local.init_client import InitProcess

_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Completed:
    """How a command ended.

    Attributes:
        returncode: exit status; ``128 + N`` when killed by signal N (also for a timeout kill).
        stdout: captured standard output (empty when it went to a file).
        stderr: captured standard error.
        stdout_dropped: bytes of stdout read but discarded beyond the cap.
        stderr_dropped: bytes of stderr read but discarded beyond the cap.
        timed_out: the command was killed at its timeout.
        duration_s: the command's run time in seconds, as measured by the init.
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int
    timed_out: bool
    duration_s: float


def _read_available(fd: int, capture: CappedBuffer) -> bool:
    """Read what ``fd`` holds now into ``capture``; ``True`` at end of file."""
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            return True
        capture.feed(chunk)


async def _drain(fd: int, capture: CappedBuffer) -> None:
    # Cancelled once the command has exited; a read is never interrupted halfway.
    while not _read_available(fd, capture):
        await anyio.wait_readable(fd)


async def _feed(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view[:_CHUNK]) :]
            except BlockingIOError:
                await anyio.wait_writable(fd)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited (or closed stdin) without reading everything


def _pipe() -> tuple[int, int]:
    read, write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(read, False)
    return read, write


async def run_command(
    init: InitProcess,
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdin: bytes | Path | None = None,
    timeout: float | None = None,
    max_output_bytes: int | None = None,
    stdout_path: Path | None = None,
) -> Completed:
    """Run ``argv`` through ``init`` and wait for it.

    Args:
        init: the sandbox's init.
        argv: program and arguments (the program is looked up on ``env["PATH"]``).
        cwd: working directory as the command sees it.
        env: the command's complete environment.
        stdin: bytes fed to standard input, or a host file opened as it; ``None`` gives
            ``/dev/null``.
        timeout: seconds until the command's process tree is killed; ``None`` waits forever.
        max_output_bytes: per-stream cap in bytes on what is kept; the rest is still read (so
            the command never blocks on a full pipe) and counted in ``*_dropped``.
        stdout_path: a host file the command's stdout is written to, uncapped, instead.

    Returns:
        The :class:`Completed` command.

    Raises:
        InitDied: the sandbox's init is gone.
        SpawnFailed: the init could not fork.
    """
    ours: list[int] = []  # closed at the end
    theirs: list[int] = []  # handed to the command; closed once it runs
    out_fd: int | None = None
    try:
        if isinstance(stdin, Path):
            theirs.append(os.open(stdin, os.O_RDONLY | os.O_CLOEXEC))
        elif stdin:
            read, stdin_fd = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(stdin_fd, False)
            theirs.append(read)
            ours.append(stdin_fd)
        else:
            theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        if stdout_path is not None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            theirs.append(os.open(stdout_path, flags, 0o600))
        else:
            out_fd, write = _pipe()
            ours.append(out_fd)
            theirs.append(write)
        err_fd, write = _pipe()
        ours.append(err_fd)
        theirs.append(write)
        command_id = await init.spawn(argv, cwd=cwd, env=env, fds=theirs)
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        out, err = CappedBuffer(max_output_bytes), CappedBuffer(max_output_bytes)
        timed_out = False
        try:
            async with anyio.create_task_group() as tg:
                if out_fd is not None:
                    tg.start_soon(_drain, out_fd, out)
                tg.start_soon(_drain, err_fd, err)
                if isinstance(stdin, bytes) and stdin:
                    tg.start_soon(_feed_then_close, ours, stdin)
                with anyio.move_on_after(timeout) as scope:
                    ended = await init.wait(command_id)
                if scope.cancelled_caught:
                    timed_out = True
                    await init.kill_tree(command_id, signal.SIGKILL)
                    ended = await init.wait(command_id)
                tg.cancel_scope.cancel()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await init.kill_tree(command_id, signal.SIGKILL)
            raise
        # What the command wrote before it exited is in the pipes now.
        if out_fd is not None:
            _read_available(out_fd, out)
        _read_available(err_fd, err)
    finally:
        for fd in (*theirs, *ours):
            with contextlib.suppress(OSError):
                os.close(fd)
    return Completed(
        returncode=128 + signal.SIGKILL if timed_out else ended.status,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        timed_out=timed_out,
        duration_s=ended.duration_s,
    )


async def _feed_then_close(ours: list[int], data: bytes) -> None:
    """Write ``data`` to the stdin pipe (``ours[0]``), then close it so the command sees EOF."""
    fd = ours[0]
    await _feed(fd, data)
    ours.remove(fd)
    os.close(fd)
