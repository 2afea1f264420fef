"""``Trajectory``: everything one episode produced, as written to ``trajectories.jsonl``."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from sandlot.rewards.result import EvalResult
from sandlot.sandboxes.setups.counts import SetupCounts


class ExitReason(str, Enum):
    """Why an episode ended."""

    SUBMITTED = "submitted"
    FINISHED = "finished"
    NO_TOOL_CALL = "no_tool_call"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    CONTEXT_LENGTH = "context_length"
    TIMEOUT_BUDGET = "timeout_budget"
    SANDBOX_DEAD = "sandbox_dead"
    INFRA_ERROR = "infra_error"

    @property
    def normal(self) -> bool:
        """``True`` when the model itself ended the episode (``submit`` or ``finish``)."""
        return self in (ExitReason.SUBMITTED, ExitReason.FINISHED)


class ToolObservation(BaseModel):
    """One tool call and what it gave back."""

    tool: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """The call's arguments; the raw text when native arguments were not a JSON object."""
    output: str
    status: str
    duration_s: float = 0.0


class Step(BaseModel):
    """One turn: the assistant's text, its calls, their observations."""

    turn: int
    content: str
    observations: list[ToolObservation] = Field(default_factory=list)
    format_error: str | None = None
    model_s: float = 0.0
    tools_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Usage(BaseModel):
    """Token counts over the episode."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_prompt_tokens: int = 0


class EpisodeSetups(BaseModel):
    """The sandboxes of an episode (or, summed, of a run) by what they were for: the agent's
    and the grading's, each set up or forked from the set-up its group shares
    (:mod:`sandlot.sandboxes.setups.cache`)."""

    agent: SetupCounts = Field(default_factory=SetupCounts)
    grading: SetupCounts = Field(default_factory=SetupCounts)

    def __add__(self, other: EpisodeSetups) -> EpisodeSetups:
        return EpisodeSetups(agent=self.agent + other.agent, grading=self.grading + other.grading)


TIMING_KEYS = ("queue", "start", "setup", "agent", "model", "tools", "eval", "total")
"""The time split, in seconds: waiting for a slot, sandbox start, repository + setup, the
agent loop (of which model and tools), reward evaluation, and the whole episode."""


class Trajectory(BaseModel):
    """One episode of one instance.

    Attributes:
        instance_id / sample: which episode (``sample`` counts the n samples of an instance).
        messages: the conversation as sent to the model, tool messages included.
        steps: per turn, the text, tool calls, observations and timings.
        exit_reason: why it ended; ``error`` says more for ``infra_error``/``sandbox_dead``.
        retryable: for ``infra_error``, whether running the episode again may succeed.
        model_patch: the diff the episode produced (``""`` when none).
        reward: 1.0 when the evaluation resolved the instance, else 0.0.
        eval: the ``EvalResult`` (``None`` when no evaluation ran).
        num_turns: model calls made; format_errors: turns with a malformed tool call (text
            that does not parse, an unknown tool, arguments that are not a JSON object or that
            the tool rejects).
        attempts: how many times the episode was started (infrastructure retries).
        setups: how the agent's sandbox and the grading's came to be: set up, or forked from
            the snapshot of a set-up of the instance (:class:`EpisodeSetups`).
        warnings: what makes the reward less trustworthy, e.g. graded files the agent's
            sandbox kept (:mod:`sandlot.rollout.graded`).
    """

    instance_id: str
    sample: int = 0
    model_name_or_path: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    exit_reason: ExitReason
    error: str | None = None
    retryable: bool = False
    model_patch: str = ""
    reward: float = 0.0
    eval: EvalResult | None = None
    num_turns: int = 0
    format_errors: int = 0
    tool_timeouts: int = 0
    usage: Usage = Field(default_factory=Usage)
    timings_s: dict[str, float] = Field(default_factory=dict)
    attempts: int = 1
    warnings: list[str] = Field(default_factory=list)
    setups: EpisodeSetups = Field(default_factory=EpisodeSetups)

    @property
    def forked(self) -> bool:
        """The agent's sandbox started from the snapshot of another sample's set-up."""
        return self.setups.agent.forked > 0

    @property
    def resolved(self) -> bool:
        """The evaluation resolved the instance."""
        return bool(self.eval and self.eval.resolved)
