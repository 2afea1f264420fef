"""One problem the preflight found: what is wrong and how to fix it, printed as one line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A reason the run would fail, known before it starts.

    Attributes:
        subject: what is at fault, as the user names it (``--output-dir``, ``backend modal``,
            ``image python:3.12``, ``--base-url``).
        message: what is wrong.
        fix: what to do about it (empty when ``message`` already says, as the errors of the
            backends do).
    """

    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        """The problem as one line: ``subject: message; fix`` (line breaks in the parts,
        such as a tool's multi-line output, are folded into spaces)."""
        text = f"{self.subject}: {self.message}"
        if self.fix:
            text = f"{text.rstrip('. ')}; {self.fix}"
        return " ".join(text.split())
