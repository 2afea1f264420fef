"""Exit statuses of ``sandlot eval`` and ``sandlot rollout`` (the README's table), and the
exceptions that end a command with one of them and one ``Error:`` line."""

from __future__ import annotations

import errno
from enum import IntEnum

import click

from sandlot.errors import SandlotError


class ExitCode(IntEnum):
    """What a run's exit status says; 128 + N is reserved for "stopped by signal N"."""

    OK = 0
    """Every prediction got a verdict (``eval``: resolved, unresolved, empty patch, or a patch
    that does not apply) / every episode ran (``rollout``), whatever the rewards."""
    ERRORS = 1
    """Some evaluations errored (``eval``: ``error_ids`` other than patches that do not apply:
    set-up, sandbox, grading) / some episodes ended in ``infra_error`` (``rollout``). The reports
    are written; re-running the same command retries them."""
    BAD_INPUT = 2
    """Refused before anything ran: a usage error (click's) or bad input (dataset empty or
    invalid, predictions, repository sources, output directory); the message gives the fix."""
    NOTHING_RESOLVED = 3
    """``eval``: nothing resolved for a reason other than the patches: the reference (``gold``)
    patches resolved nothing, or no evaluated instance's tests gave a result (the environment
    does not run them, or every run timed out)."""
    OUTPUT_FAILED = 4
    """The run could not write its logs or reports (disk full, read-only output directory)."""


class InputError(click.ClickException, SandlotError):
    """Bad input found before the run: ``Error: <message>``, exit status 2."""

    exit_code = ExitCode.BAD_INPUT


class OutputError(click.ClickException, SandlotError):
    """Logs or reports cannot be written: ``Error: <message>``, exit status 4."""

    exit_code = ExitCode.OUTPUT_FAILED


# What a full disk or an unwritable place raises; a refused connection (ECONNREFUSED, also an
# OSError) is not a write failure and keeps its own message.
_WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}
)


def write_failure(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` of a failed write (disk full, read-only or forbidden place) that
    ``exc`` is or wraps (inside exception groups, as a task group raises them, or as its
    ``__cause__``), or ``None``."""
    if exc is None:
        return None
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
        return exc
    for inner in getattr(exc, "exceptions", None) or ():
        if (found := write_failure(inner)) is not None:
            return found
    return write_failure(exc.__cause__) if exc.__cause__ is not exc else None
