"""What the model calls: ``bash``/``execute_bash``, ``str_replace_editor``, ``submit``,
``finish``, the :class:`Toolbox` that dispatches them, and the tool-call text parsers."""

from sandlot.tools.base import Tool, ToolContext
from sandlot.tools.parsers import ParsedResponse, ToolCall, get_parser
from sandlot.tools.tool_result import ToolError, ToolResult
from sandlot.tools.toolbox import DEFAULT_TOOLS, TOOLS, Toolbox

__all__ = [
    "DEFAULT_TOOLS",
    "TOOLS",
    "ParsedResponse",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "get_parser",
]
