"""The one mapping from a rollout-core :class:`Trajectory` plus its token buffer to verl's
``AgentLoopOutput``.

The token buffer is what the token-in/token-out policy built while the episode ran (verl's
Continuous Token helpers: generated tokens kept as sampled, context tokens rendered by the chat
template). The trajectory says how the episode ended and what it earned. Together they decide
what verl trains on:

* ``response_mask`` is 1 exactly on sampled tokens; a *masked* sample (an infrastructure failure,
  or an exit reason the user chose to mask) has an all-zero mask and reward 0, so it contributes
  no gradient, and its reason is recorded in ``extra_fields``;
* ``response_logprobs`` are the server's, aligned with ``response_ids`` (0.0 where the mask is
  0), or ``None`` when the request asked for none: never invented;
* every list is cut to ``response_length``;
* ``min_global_steps``/``max_global_steps`` come from the server's ``TokenOutput.extra_fields``
  (the policy versions the trajectory spans; verl's fully-async trainer computes
  ``abs(max - min)`` on them, so they are never ``None``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandlot.rewards.result import EvalStatus
from sandlot.rollout.trajectory import TIMING_KEYS, ExitReason, Trajectory

DEFAULT_MASKED_EXITS: tuple[ExitReason, ...] = (ExitReason.INFRA_ERROR, ExitReason.SANDBOX_DEAD)
"""Exit reasons whose samples are masked by default: the episode failed for reasons that are
not the model's (a sandbox that did not start or died, a model-server failure)."""

EXTRA_FIELD_KEYS = (
    "exit_reason",
    "masked",
    "mask_reason",
    "error",
    "instance_id",
    "resolved",
    "eval_status",
    "num_generations",
    "format_errors",
    "tool_timeouts",
    "timings_s",
    "global_steps",
    "min_global_steps",
    "max_global_steps",
    "turn_scores",
    "tool_rewards",
    "drift_tokens",
    "setups",
)
"""The ``extra_fields`` keys of every sample (the same keys on every path, so verl can stack
them into ``non_tensor_batch`` columns)."""


@dataclass
class TokenBuffer:
    """The token state of one trajectory, as verl's Continuous Token helpers leave it.

    Attributes:
        prompt_ids: the initial prompt (chat template with the tools and generation prompt).
        runtime_ids: prompt + everything after it (the ids sent with the next request).
        response_mask: one entry per token after the prompt; 1 = sampled by the model.
        response_logprobs: one entry per token after the prompt (0.0 where the mask is 0), or
            ``None`` when the requests asked for no log-probs.
        extra_fields: from the servers' ``TokenOutput.extra_fields``: ``global_steps``,
            ``min_global_steps`` (first call), ``max_global_steps`` (last call), ...
        num_generations: ``generate`` calls made.
        num_preempted: summed over calls, ``-1`` when the server does not report it.
        routed_experts: the last call's ``TokenOutput.routed_experts`` (MoE router replay:
            ``(tokens, layers, top_k)`` expert ids over that call's context and reply), or
            ``None``.
    """

    prompt_ids: list[int] = field(default_factory=list)
    runtime_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
    num_generations: int = 0
    num_preempted: int = -1
    routed_experts: Any = None

    @property
    def response_ids(self) -> list[int]:
        """The tokens after the prompt (the last ``len(response_mask)`` runtime ids)."""
        if not self.response_mask:
            return []
        return self.runtime_ids[-len(self.response_mask) :]


def mask_reason(traj: Trajectory, masked_exits: Iterable[ExitReason | str]) -> str | None:
    """Why ``traj`` must not be trained on, or ``None``: its exit reason is one of
    ``masked_exits``, or the evaluation itself failed (a reward of 0 that says nothing)."""
    wanted = {ExitReason(r) for r in masked_exits}
    if traj.exit_reason in wanted:
        return traj.exit_reason.value
    if traj.eval is not None and traj.eval.status is EvalStatus.ERROR:
        return "eval_error"
    return None


def to_agent_loop_output(
    traj: Trajectory,
    tokens: TokenBuffer,
    *,
    response_length: int,
    logprobs: bool,
    pad_token_id: int,
    masked_exits: Iterable[ExitReason | str] = DEFAULT_MASKED_EXITS,
    fallback_global_steps: int = 0,
    routing_shape: tuple[int, int] | None = None,
    drift_tokens: int | None = None,
) -> Any:
    """verl's ``AgentLoopOutput`` for ``traj`` (see the module docstring).

    Args:
        traj: the episode as the rollout core returned it.
        tokens: its token buffer; ``prompt_ids`` must be set (the caller renders the prompt when
            the episode failed before its first generation).
        response_length: verl's ``rollout.response_length`` (the trajectory budget).
        logprobs: the requests asked for log-probs (``sampling_params["logprobs"]``): then
            ``response_logprobs`` is a list (zeros for a sample that never generated), else
            ``None``, so every sample of a batch agrees.
        pad_token_id: the one (masked) response token of a sample that generated nothing: verl
            places the reward at the last response token, so a response is never empty.
        masked_exits: exit reasons whose samples are masked.
        fallback_global_steps: the policy version recorded for a sample that never generated.
        routing_shape: ``(layers, top_k)`` when router replay is on: a sample the server
            returned no ``routed_experts`` for gets zeros of that shape, so the batch (where
            verl concatenates every sample's) still stacks; ``None`` when replay is off.
        drift_tokens: :func:`sandlot.trainer.drift.drifted_tokens` of the sample, or ``None``
            when the drift check is off.
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    reason = mask_reason(traj, masked_exits)
    response_ids = tokens.response_ids[:response_length]
    response_mask = list(tokens.response_mask[:response_length])
    response_logprobs: list[float] | None = None
    if logprobs:
        if tokens.response_logprobs is not None:
            response_logprobs = list(tokens.response_logprobs[:response_length])
        else:  # nothing generated (or the server returned none: then the sample is masked)
            response_logprobs = [0.0] * len(response_ids)
    if not response_ids:
        response_ids, response_mask = [pad_token_id], [0]
        response_logprobs = [0.0] if logprobs else None
    if reason is not None:
        response_mask = [0] * len(response_ids)
    if response_logprobs is not None:
        # "No log-prob where none was sampled": context and boundary tokens carry 0.0.
        pairs = zip(response_logprobs, response_mask, strict=True)
        response_logprobs = [lp if m else 0.0 for lp, m in pairs]
    steps = dict(tokens.extra_fields)
    first = steps.get("min_global_steps", steps.get("global_steps"))
    last = steps.get("max_global_steps", steps.get("global_steps"))
    first = fallback_global_steps if first is None else first
    last = first if last is None else last
    routed = _routed_experts(tokens, len(tokens.prompt_ids) + len(response_ids), routing_shape)
    timings = {key: float(traj.timings_s.get(key, 0.0)) for key in TIMING_KEYS}
    extra: dict[str, Any] = {
        "exit_reason": traj.exit_reason.value,
        "masked": reason is not None,
        "mask_reason": reason,
        "error": traj.error,
        "instance_id": traj.instance_id,
        "resolved": traj.resolved,
        "eval_status": traj.eval.status.value if traj.eval is not None else None,
        "num_generations": tokens.num_generations,
        "format_errors": traj.format_errors,
        "tool_timeouts": traj.tool_timeouts,
        "timings_s": timings,
        "global_steps": steps.get("global_steps", last),
        "min_global_steps": first,
        "max_global_steps": last,
        "turn_scores": [],
        "tool_rewards": [],
        "drift_tokens": drift_tokens,
        "setups": traj.setups.model_dump(),
    }
    return AgentLoopOutput(
        prompt_ids=list(tokens.prompt_ids),
        response_ids=list(response_ids),
        response_mask=response_mask,
        response_logprobs=response_logprobs,
        reward_score=0.0 if reason is not None else float(traj.reward),
        num_turns=sum(1 for m in traj.messages if m.get("role") != "system"),
        routed_experts=routed,
        metrics=AgentLoopMetrics(
            generate_sequences=timings["model"],
            tool_calls=timings["tools"],
            compute_score=timings["eval"],
            num_preempted=tokens.num_preempted,
        ),
        extra_fields=extra,
    )


def _routed_experts(tokens: TokenBuffer, length: int, shape: tuple[int, int] | None) -> Any:
    """The expert ids over prompt + response (cut to ``length`` tokens, as verl's
    ``ToolAgentLoop`` cuts them), zeros of ``shape`` for a sample that has none when router
    replay is on, else ``None``."""
    if tokens.routed_experts is not None:
        return tokens.routed_experts[:length]
    if shape is None:
        return None
    import numpy as np

    return np.zeros((length, *shape), dtype=np.int16)
