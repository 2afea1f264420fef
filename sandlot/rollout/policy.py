"""``Policy``: what the agent loop asks for each assistant turn.

Two implementations share it, so that what is evaluated is what is trained: the OpenAI-compatible
chat client (:mod:`sandlot.rollout.llm`) for inference, and the trainer's token-in/token-out
policy over verl's ``server_manager`` for training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sandlot.errors import SandlotError
from sandlot.tools.parsers import ToolCall

Message = dict[str, Any]
"""A chat message as the OpenAI API writes it (``role``, ``content``, ``tool_calls``, ...)."""


@dataclass
class PolicyTurn:
    """One assistant turn.

    Attributes:
        content: the assistant's text. With a text tool-call format (``hermes``,
            ``qwen3_coder``) the calls are in it and the agent loop parses them.
        tool_calls: native tool calls (the OpenAI ``tool_calls`` field); ``None`` when the
            policy returns text only. A call whose arguments did not decode to a JSON object
            keeps them as the text the model wrote (a ``str``); the toolbox answers it with a
            format error.
        prompt_tokens: tokens of the prompt of this call (the context length so far).
        completion_tokens: tokens generated in this call.
        finish_reason: ``"stop"``, ``"tool_calls"`` or ``"length"`` (the generation hit its
            token limit; the episode ends).
        extra: policy-specific data kept with the turn (e.g. verl's ``global_steps``).
    """

    content: str
    tool_calls: list[ToolCall] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class PolicyError(SandlotError):
    """The model server failed (connection, 5xx, 429 after retries): an infrastructure fault,
    not the model's. ``retryable`` says whether running the episode again may succeed."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ContextLengthError(PolicyError):
    """The conversation no longer fits the model's context window. Not an infrastructure
    fault: the agent loop ends the episode as ``context_length`` and grades what it has."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Policy(Protocol):
    """The model, as the agent loop sees it."""

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
    ) -> PolicyTurn:
        """The next assistant turn for ``messages`` (the whole conversation so far).

        Args:
            messages: system, user, assistant and tool messages, oldest first.
            tools: the OpenAI ``tools`` schemas of the episode's toolbox.
            max_tokens: the most tokens this turn may generate (what is left of the episode's
                ``generation`` budget); the agent loop passes it only when the config sets one.

        Raises:
            ContextLengthError: the conversation does not fit the model's context.
            PolicyError: the model could not be reached or answered with an error.
        """
        ...

    def secrets(self) -> list[str]:
        """Strings (API keys) to redact from observations and trajectories."""
        ...
