"""``str_replace_editor``: view, create and edit files, as SWE-agent's tool of that name.

Behaviour and messages reproduce SWE-agent's ``tools/edit_anthropic/bin/str_replace_editor``
(itself Anthropic's text editor tool): ``view`` prints files like ``cat -n`` (6-wide line
numbers, a tab, tabs expanded) and directories with ``find -maxdepth 2`` minus hidden entries;
``str_replace`` needs exactly one match and answers with a numbered snippet of 4 lines around
the edit; ``insert`` goes after ``insert_line``; ``undo_edit`` restores the file as it was
before the last edit. Outputs longer than ``max_response_chars`` are clipped with SWE-agent's
``<response clipped>`` note.

Differences: all I/O goes through the sandbox (``read_file``, ``write_file``, ``exec``), the
undo history lives in this process and restores exact bytes, and a ``str_replace`` whose
``old_str`` matches the file as it is leaves its tabs alone (SWE-agent always rewrites the
whole file with tabs expanded; that still happens when only the tab-expanded text matches).
"""

from __future__ import annotations

import posixpath
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandlot.errors import SandboxFileError
from sandlot.sandboxes.archive import DownloadLimitError
from sandlot.tools.base import Tool, ToolContext
from sandlot.tools.tool_result import ToolError, ToolResult

TRUNCATED_MESSAGE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry this tool after you have searched inside the file with `grep -n` in "
    "order to find the line numbers of what you are looking for.</NOTE>"
)
SNIPPET_LINES = 4
_KIND_SCRIPT = 'if [ -d "$1" ]; then echo dir; elif [ -e "$1" ]; then echo file; else echo none; fi'
_FIND_SCRIPT = "find \"$1\" -maxdepth 2 -not -path '*/.*'"
_TIMEOUT_S = 60.0

Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]


class EditorArgs(BaseModel):
    """Arguments of ``str_replace_editor`` (SWE-agent's parameter names and descriptions)."""

    model_config = ConfigDict(extra="forbid")

    command: Command = Field(
        description="The commands to run. Allowed options are: `view`, `create`, "
        "`str_replace`, `insert`, `undo_edit`."
    )
    path: str = Field(
        description="Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`."
    )
    file_text: str | None = Field(
        default=None,
        description="Required parameter of `create` command, with the content of the file to "
        "be created.",
    )
    old_str: str | None = Field(
        default=None,
        description="Required parameter of `str_replace` command containing the string in "
        "`path` to replace.",
    )
    new_str: str | None = Field(
        default=None,
        description="Optional parameter of `str_replace` command containing the new string (if "
        "not given, no string will be added). Required parameter of `insert` command containing "
        "the string to insert.",
    )
    insert_line: int | None = Field(
        default=None,
        description="Required parameter of `insert` command. The `new_str` will be inserted "
        "AFTER the line `insert_line` of `path`.",
    )
    view_range: list[int] | None = Field(
        default=None,
        description="Optional parameter of `view` command when `path` points to a file. If "
        "none is given, the full file is shown. If provided, the file will be shown in the "
        "indicated line number range, e.g. [11, 12] will show lines 11 and 12. Indexing at 1 "
        "to start. Setting `[start_line, -1]` shows all lines from `start_line` to the end of "
        "the file.",
    )


class EditorConfig(BaseModel):
    """Settings of ``str_replace_editor``.

    Attributes:
        max_response_chars: file text shown by one call before it is clipped.
        max_file_bytes: largest file, in bytes, that ``view`` and the edit commands read
            (passed to ``Sandbox.read_file`` as ``max_bytes``); a larger one is an error
            observation pointing the model to ``grep -n``/``sed -n``, never a read that fills
            the caller's memory (a sparse file can claim gigabytes).
    """

    model_config = ConfigDict(extra="forbid")

    max_response_chars: int = Field(default=16_000, gt=0)
    max_file_bytes: int = Field(default=10 * 1024 * 1024, gt=0)


def _decode(data: bytes) -> tuple[str, str]:
    """Text and encoding of a file, trying UTF-8 then Latin-1 (as SWE-agent does)."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return data.decode("latin-1"), "latin-1"


class StrReplaceEditor(Tool):
    """SWE-agent's file viewer and editor over the sandbox's files."""

    name: ClassVar[str] = "str_replace_editor"
    description: ClassVar[str] = (
        "Custom editing tool for viewing, creating and editing files\n"
        "* State is persistent across command calls and discussions with the user\n"
        "* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a "
        "directory, `view` lists non-hidden files and directories up to 2 levels deep\n"
        "* The `create` command cannot be used if the specified `path` already exists as a file\n"
        "* If a `command` generates a long output, it will be truncated and marked with "
        "`<response clipped>`\n"
        "* The `undo_edit` command will revert the last edit made to the file at `path`\n\n"
        "Notes for using the `str_replace` command:\n"
        "* The `old_str` parameter should match EXACTLY one or more consecutive lines from the "
        "original file. Be mindful of whitespaces!\n"
        "* If the `old_str` parameter is not unique in the file, the replacement will not be "
        "performed. Make sure to include enough context in `old_str` to make it unique\n"
        "* The `new_str` parameter should contain the edited lines that should replace the "
        "`old_str`"
    )
    Args: ClassVar[type[BaseModel]] = EditorArgs
    Config: ClassVar[type[BaseModel]] = EditorConfig
    config: EditorConfig

    def __init__(self, context: ToolContext, config: BaseModel | None = None) -> None:
        super().__init__(context, config)
        self._history: dict[str, list[bytes]] = {}

    # ----------------------------------------------------------------- sandbox I/O

    async def _kind(self, path: str) -> str:
        r = await self.context.sandbox.exec(["bash", "-c", _KIND_SCRIPT, "kind", path])
        return r.stdout.strip() or "none"

    async def _read(self, path: str) -> bytes:
        limit = self.config.max_file_bytes
        try:
            return await self.context.sandbox.read_file(path, max_bytes=limit)
        except DownloadLimitError as exc:
            raise ToolError(
                f"The file {path} is larger than {limit} bytes, too large to open with this "
                "tool. Search it with `grep -n` and show parts with `sed -n 'START,ENDp'`."
            ) from exc
        except SandboxFileError as exc:
            raise ToolError(f"Ran into {exc} while trying to read {path}") from exc

    async def _write(self, path: str, data: bytes) -> None:
        try:
            await self.context.sandbox.write_file(path, data)
        except SandboxFileError as exc:
            raise ToolError(f"Ran into {exc} while trying to write to {path}") from exc

    # ----------------------------------------------------------------- output

    def _clip(self, text: str) -> str:
        limit = self.config.max_response_chars
        return text if len(text) <= limit else text[:limit] + TRUNCATED_MESSAGE

    def _numbered(self, content: str, descriptor: str, init_line: int = 1) -> str:
        content = self._clip(content).expandtabs()
        lines = [f"{i + init_line:6}\t{line}" for i, line in enumerate(content.split("\n"))]
        return f"Here's the result of running `cat -n` on {descriptor}:\n" + "\n".join(lines) + "\n"

    # ----------------------------------------------------------------- commands

    async def run(self, args: EditorArgs) -> ToolResult:
        path = args.path
        if not posixpath.isabs(path):
            suggested = posixpath.join(self.context.repo, path)
            raise ToolError(
                f"The path {path} is not an absolute path, it should start with `/`. "
                f"Maybe you meant {suggested}?"
            )
        path = posixpath.normpath(path)
        kind = await self._kind(path)
        if kind == "none" and args.command != "create":
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
        if kind != "none" and args.command == "create":
            raise ToolError(
                f"File already exists at: {path}. Cannot overwrite files using command `create`."
            )
        if kind == "dir" and args.command != "view":
            raise ToolError(
                f"The path {path} is a directory and only the `view` command can be used on "
                "directories"
            )
        if args.command == "view":
            return ToolResult(output=await self._view(path, kind, args.view_range))
        if args.command == "create":
            if args.file_text is None:
                raise ToolError("Parameter `file_text` is required for command: create")
            return ToolResult(output=await self._create(path, args.file_text))
        if args.command == "str_replace":
            if args.old_str is None:
                raise ToolError("Parameter `old_str` is required for command: str_replace")
            return ToolResult(output=await self._str_replace(path, args.old_str, args.new_str))
        if args.command == "insert":
            if args.insert_line is None:
                raise ToolError("Parameter `insert_line` is required for command: insert")
            if args.new_str is None:
                raise ToolError("Parameter `new_str` is required for command: insert")
            return ToolResult(output=await self._insert(path, args.insert_line, args.new_str))
        return ToolResult(output=await self._undo(path))

    async def _view(self, path: str, kind: str, view_range: list[int] | None) -> str:
        if kind == "dir":
            if view_range:
                raise ToolError(
                    "The `view_range` parameter is not allowed when `path` points to a directory."
                )
            r = await self.context.sandbox.exec(
                ["bash", "-c", _FIND_SCRIPT, "find", path], timeout=_TIMEOUT_S
            )
            if r.stderr:
                raise ToolError(r.stderr.strip())
            return (
                f"Here's the files and directories up to 2 levels deep in {path}, excluding "
                f"hidden items:\n{r.stdout}\n"
            )
        content, _ = _decode(await self._read(path))
        if not view_range:
            return self._numbered(content, path)
        if len(view_range) != 2:
            raise ToolError("Invalid `view_range`. It should be a list of two integers.")
        lines = content.split("\n")
        first, last = view_range
        if first < 1 or first > len(lines):
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its first element `{first}` should be "
                f"within the range of lines of the file: {[1, len(lines)]}"
            )
        if last > len(lines):
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its second element `{last}` should be "
                f"smaller than the number of lines in the file: `{len(lines)}`"
            )
        if last != -1 and last < first:
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its second element `{last}` should be "
                f"larger or equal than its first `{first}`"
            )
        stop = len(lines) if last == -1 else last
        return self._numbered("\n".join(lines[first - 1 : stop]), path, first)

    async def _create(self, path: str, text: str) -> str:
        parent = posixpath.dirname(path)
        if await self._kind(parent) != "dir":
            raise ToolError(
                f"The parent directory {parent} does not exist. Please create it first."
            )
        data = text.encode()
        await self._write(path, data)
        self._history.setdefault(path, []).append(data)
        return f"File created successfully at: {path}"

    async def _str_replace(self, path: str, old_str: str, new_str: str | None) -> str:
        before = await self._read(path)
        content, encoding = _decode(before)
        new = new_str or ""
        if content.count(old_str) != 1 and "\t" in content:
            # SWE-agent compares with tabs expanded everywhere (and writes the file so).
            content, old_str, new = content.expandtabs(), old_str.expandtabs(), new.expandtabs()
        occurrences = content.count(old_str)
        if occurrences == 0:
            raise ToolError(
                f"No replacement was performed, old_str `{old_str}` did not appear verbatim in "
                f"{path}."
            )
        if occurrences > 1:
            lines = [i + 1 for i, line in enumerate(content.split("\n")) if old_str in line]
            raise ToolError(
                f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in "
                f"lines {lines}. Please ensure it is unique"
            )
        if new == old_str:
            raise ToolError(
                f"No replacement was performed, old_str `{old_str}` is the same as new_str `{new}`."
            )
        updated = content.replace(old_str, new)
        await self._write(path, updated.encode(encoding))
        self._history.setdefault(path, []).append(before)
        replacement_line = content.split(old_str)[0].count("\n")
        start = max(1, replacement_line - SNIPPET_LINES)
        end = min(replacement_line + SNIPPET_LINES + new.count("\n"), len(updated.splitlines()))
        snippet = "\n".join(updated.split("\n")[start - 1 : end])
        return (
            f"The file {path} has been edited. "
            + self._numbered(snippet, f"a snippet of {path}", start)
            + "Review the changes and make sure they are as expected. Edit the file again if "
            "necessary."
        )

    async def _insert(self, path: str, insert_line: int, new_str: str) -> str:
        before = await self._read(path)
        text, encoding = _decode(before)
        text, new_str = text.expandtabs(), new_str.expandtabs()
        lines = text.split("\n")
        if insert_line < 0 or insert_line > len(lines):
            raise ToolError(
                f"Invalid `insert_line` parameter: {insert_line}. It should be within the range "
                f"of lines of the file: {[0, len(lines)]}"
            )
        new_lines = new_str.split("\n")
        updated = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
        snippet = "\n".join(
            lines[max(0, insert_line - SNIPPET_LINES) : insert_line]
            + new_lines
            + lines[insert_line : insert_line + SNIPPET_LINES]
        )
        await self._write(path, updated.encode(encoding))
        self._history.setdefault(path, []).append(before)
        return (
            f"The file {path} has been edited. "
            + self._numbered(
                snippet, "a snippet of the edited file", max(1, insert_line - SNIPPET_LINES + 1)
            )
            + "Review the changes and make sure they are as expected (correct indentation, no "
            "duplicate lines, etc). Edit the file again if necessary."
        )

    async def _undo(self, path: str) -> str:
        history = self._history.get(path)
        if not history:
            raise ToolError(f"No edit history found for {path}.")
        previous = history.pop()
        await self._write(path, previous)
        return f"Last edit to {path} undone successfully. " + self._numbered(
            _decode(previous)[0], path
        )
