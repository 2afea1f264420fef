"""What a rollout keeps in memory of one finished episode: an :class:`EpisodeRecord`, keyed by
(``instance_id``, ``sample``).

Resume, the live counters and the summary all work from records, not trajectories, so the
memory of a long run does not grow with its messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandlot.rollout.trajectory import EpisodeSetups, ExitReason, Trajectory

EpisodeKey = tuple[str, int]
"""(``instance_id``, ``sample``): what resume matches on."""


@dataclass
class EpisodeRecord:
    """What the scheduler keeps in memory of one finished episode (not its messages)."""

    instance_id: str
    sample: int
    reward: float
    resolved: bool
    exit_reason: ExitReason
    retryable: bool
    num_turns: int
    format_errors: int
    attempts: int
    model_name_or_path: str
    eval_status: str | None
    timings_s: dict[str, float]
    prompt_tokens: int
    completion_tokens: int
    setups: EpisodeSetups

    @property
    def key(self) -> EpisodeKey:
        return (self.instance_id, self.sample)

    @classmethod
    def of(cls, traj: Trajectory) -> EpisodeRecord:
        return cls(
            instance_id=traj.instance_id,
            sample=traj.sample,
            reward=traj.reward,
            resolved=traj.resolved,
            exit_reason=traj.exit_reason,
            retryable=traj.retryable,
            num_turns=traj.num_turns,
            format_errors=traj.format_errors,
            attempts=traj.attempts,
            model_name_or_path=traj.model_name_or_path,
            eval_status=traj.eval.status.value if traj.eval is not None else None,
            timings_s=dict(traj.timings_s),
            prompt_tokens=traj.usage.prompt_tokens,
            completion_tokens=traj.usage.completion_tokens,
            setups=traj.setups,
        )
