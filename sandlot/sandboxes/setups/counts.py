"""``SetupCounts``: how many sandboxes were set up and how many forked (of one sample, one
purpose of a run, or a whole cache)."""

from __future__ import annotations

from pydantic import BaseModel


class SetupCounts(BaseModel):
    """Sandboxes set up (``prepare`` ran in them) and started as forks of a set-up.

    A sample that forks its group's set-up counts ``forked=1``; the one that set the group up
    counts ``set_up=1`` (and ``forked=1`` too when it then ran in a fork, as gradings do).
    """

    set_up: int = 0
    forked: int = 0

    def __add__(self, other: SetupCounts) -> SetupCounts:
        return SetupCounts(set_up=self.set_up + other.set_up, forked=self.forked + other.forked)
