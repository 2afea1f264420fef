"""The rollout's errors: one root, :class:`RolloutError`, so ``sandlot rollout`` can report
every way a run cannot go as asked in one place."""

from sandlot.errors import SandlotError


class RolloutError(SandlotError):
    """The rollout cannot run as asked (the message says why and what to do)."""


class TrajectoryFileError(RolloutError, ValueError):
    """``trajectories.jsonl`` is damaged beyond a torn last line, or is locked by another run."""
