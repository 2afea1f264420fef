"""An episode as the audit reads it: its tool calls in order, each as one command line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sandlot.rollout.trajectory import Trajectory

EDITOR_WRITES = ("create", "str_replace", "insert", "undo_edit")
"""``str_replace_editor`` commands that change the file they name."""


@dataclass(frozen=True)
class Call:
    """One tool call of an episode.

    Attributes:
        turn: the step's ``turn`` (1-based, as ``report.html`` shows it).
        tool: the tool's name.
        command: the call as one command line (:func:`command_line`).
        written: every string of its arguments, joined (what the agent wrote in it).
        path: the path an editor call names (``""`` otherwise).
        edits: an editor call that changes ``path``.
        output: the observation.
    """

    turn: int
    tool: str
    command: str
    written: str
    path: str
    edits: bool
    output: str


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def command_line(tool: str, arguments: dict[str, Any] | str) -> str:
    """A tool call as one line: ``bash``'s (or ``execute_bash``'s) ``command``;
    ``str_replace_editor <command> <path>``; else the tool's name and its JSON arguments (the
    raw text when they were not a JSON object)."""
    if isinstance(arguments, str):
        return f"{tool} {arguments}"
    command = arguments.get("command")
    if isinstance(command, str) and tool in ("bash", "execute_bash"):
        return command
    path = arguments.get("path")
    if isinstance(command, str) and isinstance(path, str):
        return f"{tool} {command} {path}"
    return f"{tool} {json.dumps(arguments, ensure_ascii=False)}".rstrip()


def episode_calls(traj: Trajectory) -> list[Call]:
    """The tool calls of ``traj``, in the order they ran."""
    calls = []
    for step in traj.steps:
        for obs in step.observations:
            args = obs.arguments
            path = args.get("path", "") if isinstance(args, dict) else ""
            sub = args.get("command", "") if isinstance(args, dict) else ""
            calls.append(
                Call(
                    turn=step.turn,
                    tool=obs.tool,
                    command=command_line(obs.tool, args),
                    written="\n".join(_strings(args)),
                    path=path if isinstance(path, str) else "",
                    edits=obs.tool != "bash" and sub in EDITOR_WRITES,
                    output=obs.output,
                )
            )
    return calls


def prompt_text(traj: Trajectory) -> str:
    """The messages before the first assistant message (what the agent was given)."""
    parts = []
    for message in traj.messages:
        if message.get("role") == "assistant":
            break
        parts.extend(_strings(message.get("content")))
    return "\n".join(parts)
