"""The result of a one-shot command."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

TIMEOUT_EXIT_CODE = 124
"""``exit_code`` reported for a command killed at its timeout (the GNU ``timeout`` convention)."""


class ExecResult(BaseModel):
    """What a command printed and how it ended.

    A non-zero ``exit_code`` is a normal result, not an exception. A command killed at its
    timeout has ``timed_out=True``, ``exit_code=124`` and keeps everything it printed before.
    A command killed by signal N reports ``128 + N`` like a shell does.

    Attributes:
        exit_code: exit status of the command.
        stdout: standard output, decoded as UTF-8 with invalid bytes replaced.
        stderr: standard error, decoded likewise.
        timed_out: the command was killed because it exceeded its timeout.
        duration_s: wall time of the command in seconds, as measured by the caller's side.
        truncated: ``stdout`` or ``stderr`` exceeded the output cap and was cut.
    """

    model_config = ConfigDict(frozen=True)

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """``True`` when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out
