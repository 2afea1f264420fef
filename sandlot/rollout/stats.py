"""The live counters of a rollout: updated by the scheduler as episodes finish, read by the
display while it runs, returned when it ends."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from sandlot.rollout.record import EpisodeRecord
from sandlot.rollout.trajectory import ExitReason


@dataclass
class RolloutStats:
    """Live counters of a rollout (read by the display; updated by the scheduler).

    ``done``, ``resolved``, ``errors``, ``turns`` and ``exit_reasons`` count every episode with
    a trajectory (resumed ones included); ``new`` only those finished by this run.
    """

    total: int = 0
    resumed: int = 0
    queued: int = 0
    running: int = 0
    done: int = 0
    new: int = 0
    resolved: int = 0
    errors: int = 0
    retries: int = 0
    turns: int = 0
    starting: int = 0
    alive: int = 0
    started_at: float = field(default_factory=time.monotonic)
    exit_reasons: Counter[str] = field(default_factory=Counter)

    def count(self, record: EpisodeRecord) -> None:
        self.done += 1
        self.resolved += record.resolved
        self.errors += record.exit_reason is ExitReason.INFRA_ERROR
        self.turns += record.num_turns
        self.exit_reasons[record.exit_reason.value] += 1
