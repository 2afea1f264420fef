"""``bash`` / ``execute_bash``: run a command in the episode's persistent shell session.

Messages follow SWE-agent's: an empty successful output says so, a timeout says the command
was cancelled and why that usually happens. The exit status of a failing command is appended.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from sandlot.runtimes.observation import Observation
from sandlot.tools.base import Tool
from sandlot.tools.tool_result import ToolResult

EMPTY_OUTPUT = "Your command ran successfully and did not produce any output."


class BashArgs(BaseModel):
    """Arguments of ``bash``."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="The bash command to run. It can span several lines; use `&` for "
        "long-running servers, with their output redirected to a file."
    )


class BashConfig(BaseModel):
    """Settings of ``bash``.

    Attributes:
        timeout_s: seconds a command may run before it is interrupted.
        idle_timeout_s: seconds without output after which it is interrupted (``None``: off).
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=180.0, gt=0)
    idle_timeout_s: float | None = Field(default=None, gt=0)


def _append(text: str, note: str) -> str:
    if not text:
        return note
    return text + ("" if text.endswith("\n") else "\n") + note


def format_observation(command: str, obs: Observation, config: BashConfig) -> str:
    """The text the model reads for ``obs``."""
    text = obs.output
    if obs.timed_out:
        limit = (
            f"{config.timeout_s:g} seconds"
            if config.idle_timeout_s is None or obs.duration_s >= config.timeout_s
            else f"{config.idle_timeout_s:g} seconds without output"
        )
        note = (
            f"The command '{command}' was cancelled because it took more than {limit}. "
            "Please try a different command that completes more quickly. Note: a common source "
            "of this error is a command that is interactive or waits for input, which never "
            "comes here; run long-lived servers in the background with `&`."
        )
        return _append(text, note)
    if obs.interrupted:
        return _append(text, "The command was interrupted.")
    if not text and obs.exit_code == 0 and not obs.shell_restarted:
        return EMPTY_OUTPUT
    if obs.exit_code != 0:
        text = _append(text, f"[exit code: {obs.exit_code}]")
    if obs.shell_restarted:
        text = _append(
            text,
            "[The shell exited; the next command runs in a new shell started in the initial "
            "directory with the initial environment.]",
        )
    return text


class BashTool(Tool):
    """Runs a command in the sandbox's persistent shell (``cd``, ``export``, background jobs
    carry over between calls)."""

    name: ClassVar[str] = "bash"
    description: ClassVar[str] = (
        "Run a bash command in a persistent shell: the working directory, environment "
        "variables and background processes persist between calls. Interactive programs "
        "cannot receive input (standard input is empty). Long outputs are truncated in the "
        "middle."
    )
    Args: ClassVar[type[BaseModel]] = BashArgs
    Config: ClassVar[type[BaseModel]] = BashConfig
    config: BashConfig

    async def run(self, args: BashArgs) -> ToolResult:
        shell = await self.context.shell()
        obs = await shell.run(
            args.command, timeout=self.config.timeout_s, idle_timeout=self.config.idle_timeout_s
        )
        return ToolResult(
            output=format_observation(args.command, obs, self.config),
            status="timeout" if obs.timed_out else "ok",
        )


class ExecuteBashTool(BashTool):
    """``bash`` under the name OpenHands and R2E-Gym prompts use."""

    name: ClassVar[str] = "execute_bash"
