"""``ToolResult``: what a tool call gives back to the model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandlot.errors import SandlotError

ToolStatus = Literal["ok", "error", "format_error", "timeout"]


class ToolResult(BaseModel):
    """The observation of one tool call.

    Attributes:
        output: the text the model sees.
        status: ``ok`` (the tool ran; a command that exited non-zero is still ``ok``),
            ``error`` (the tool failed: bad path, dead sandbox, ...), ``format_error`` (the call
            itself was malformed: unknown tool, bad JSON, invalid arguments, unparsable text),
            ``timeout`` (the command was stopped at its time limit).
        done: the call ends the episode (``submit``, ``finish``).
        patch: the model patch, set by ``submit``.
    """

    model_config = ConfigDict(frozen=True)

    output: str
    status: ToolStatus = "ok"
    done: bool = False
    patch: str | None = None


class ToolError(SandlotError):
    """Raised by a tool for a failure the model should read (becomes ``status="error"``)."""
