"""A policy that runs one bash command, then ends the episode with a turn without a tool call."""

from __future__ import annotations

import json
from typing import Any

from sandlot.rollout.policy import Message, PolicyTurn


class RunOnce:
    """Calls the ``bash`` tool with ``command`` on its first turn and answers ``done`` next."""

    def __init__(self, command: str) -> None:
        call = json.dumps({"name": "bash", "arguments": {"command": command}})
        self.turns = [f"<tool_call>\n{call}\n</tool_call>", "done"]

    async def generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        return PolicyTurn(content=self.turns.pop(0))

    def secrets(self) -> list[str]:
        return []
