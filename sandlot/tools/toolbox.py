"""``Toolbox``: the tools of one episode, built from config, with safe dispatch.

Every way a call can go wrong becomes a :class:`ToolResult` for the model, never an exception:
unknown tool, arguments that are not JSON or not an object, arguments the tool's model rejects
(``format_error``), and a tool that fails, including a sandbox that died (``error``). Only
cancellation propagates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from sandlot.errors import SandboxDeadError, SandboxError
from sandlot.tools.base import Tool, ToolContext
from sandlot.tools.bash import BashTool, ExecuteBashTool
from sandlot.tools.editor import StrReplaceEditor
from sandlot.tools.submit import FinishTool, SubmitTool
from sandlot.tools.tool_result import ToolError, ToolResult

log = logging.getLogger("sandlot.tools")

TOOLS: dict[str, type[Tool]] = {
    cls.name: cls for cls in (BashTool, ExecuteBashTool, StrReplaceEditor, SubmitTool, FinishTool)
}
"""Every built-in tool by name."""

DEFAULT_TOOLS = ("bash", "str_replace_editor", "submit")
"""SWE-agent's tool set."""

ToolSpec = str | Mapping[str, Any]
"""A tool in a toolbox config: its name, or ``{"name": ..., **settings}``."""


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


class Toolbox:
    """A selection of tools bound to one episode's sandbox.

    Args:
        tools: tool instances; names must be unique.

    Raises:
        ValueError: two tools share a name.
    """

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"duplicate tool {tool.name!r}")
            self.tools[tool.name] = tool

    @classmethod
    def from_config(
        cls, specs: Sequence[ToolSpec] = DEFAULT_TOOLS, *, context: ToolContext
    ) -> Toolbox:
        """Build the tools named in ``specs`` (see :data:`ToolSpec`) over ``context``.

        Raises:
            ValueError: an unknown tool name, or settings its ``Config`` rejects.
        """
        tools = []
        for spec in specs:
            fields = {"name": spec} if isinstance(spec, str) else dict(spec)
            name = fields.pop("name", None)
            if name not in TOOLS:
                raise ValueError(f"unknown tool {name!r}; known tools: {', '.join(TOOLS)}")
            tool_cls = TOOLS[name]
            try:
                config = tool_cls.Config.model_validate(fields)
            except ValidationError as exc:
                raise ValueError(f"invalid settings for tool {name!r}: {exc}") from exc
            tools.append(tool_cls(context, config))
        return cls(tools)

    @property
    def names(self) -> list[str]:
        """The tools' names, in order."""
        return list(self.tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list of this toolbox."""
        return [tool.schema() for tool in self.tools.values()]

    @staticmethod
    def format_error(message: str) -> ToolResult:
        """The observation for a model turn whose tool calls could not be read."""
        return ToolResult(output=message, status="format_error")

    async def call(self, name: str, arguments: str | Mapping[str, Any] | None) -> ToolResult:
        """Run tool ``name`` with ``arguments`` (a JSON object as text, or already parsed).

        Returns:
            The tool's :class:`ToolResult`, or one describing why the call failed.
        """
        tool = self.tools.get(name)
        if tool is None:
            return self.format_error(
                f"Unknown tool {name!r}. Available tools: {', '.join(self.tools)}."
            )
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return self.format_error(f"The arguments of {name} are not valid JSON: {exc}.")
        if not isinstance(arguments, Mapping):
            return self.format_error(
                f"The arguments of {name} must be a JSON object, got {type(arguments).__name__}."
            )
        try:
            args: BaseModel = tool.Args.model_validate(dict(arguments))
        except ValidationError as exc:
            return self.format_error(f"Invalid arguments for {name}: {_validation_message(exc)}.")
        try:
            return await tool.run(args)
        except ToolError as exc:
            return ToolResult(output=str(exc), status="error")
        except SandboxDeadError as exc:
            return ToolResult(output=f"The sandbox is no longer running: {exc}", status="error")
        except SandboxError as exc:
            return ToolResult(output=f"{name} failed: {exc}", status="error")
        except Exception as exc:  # a tool bug must not end the episode's process
            log.exception("tool %s failed", name)
            return ToolResult(output=f"{name} failed: {type(exc).__name__}: {exc}", status="error")
