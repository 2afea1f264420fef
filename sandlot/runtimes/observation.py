"""``Observation``: what one command run in a shell session printed and how it ended."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SYNTAX_ERROR_EXIT_CODE = 2
"""``exit_code`` of a command rejected by ``bash -n`` (bash's own status for a syntax error)."""

INTERRUPTED_EXIT_CODE = 130
"""``exit_code`` of a command stopped by :meth:`BashSession.interrupt` (128 + SIGINT)."""


class Observation(BaseModel):
    """The result of :meth:`sandlot.runtimes.BashSession.run`.

    A non-zero ``exit_code`` is a normal result. Exit codes follow the shell: ``128 + N`` for a
    command killed by signal N, ``2`` for a syntax error (the command did not run), ``124``
    (``TIMEOUT_EXIT_CODE``) when the command was stopped at ``timeout`` or ``idle_timeout``,
    ``130`` when it was stopped by ``interrupt()``.

    Attributes:
        output: standard output and standard error, interleaved as the command wrote them,
            decoded as UTF-8 (invalid bytes replaced). Longer than the session's
            ``max_output_chars`` it keeps the head and the tail around a truncation note.
        exit_code: exit status of the command (see above).
        timed_out: stopped because ``timeout`` passed or no output came for ``idle_timeout``.
        interrupted: stopped before it finished (timeout, idle timeout or ``interrupt()``).
        truncated: the middle of ``output`` was elided.
        duration_s: wall time in seconds from sending the command to its result.
        shell_restarted: the shell itself ended during the command (a top-level ``exit`` or
            ``exec``, ``set -e`` failing inside a function, the shell killed, or a command that
            could not be stopped); the next command runs in a fresh shell in the starting
            directory with the starting environment, and background jobs are gone.
    """

    model_config = ConfigDict(frozen=True)

    output: str
    exit_code: int
    timed_out: bool = False
    interrupted: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    shell_restarted: bool = False

    @property
    def ok(self) -> bool:
        """``True`` when the command exited 0 and was not stopped."""
        return self.exit_code == 0 and not self.interrupted
