"""A virtual clock for the model client's retry budget, so that minutes of outage take no
wall-clock time and no test depends on how fast the machine is."""

from __future__ import annotations

from collections.abc import Callable

import anyio.lowlevel


class VirtualClock:
    """Seconds that pass only when someone sleeps.

    ``sleep(d)`` yields once and moves the clock to the sleeper's wake-up time (never back),
    so concurrent sleepers overlap as they would in real time: two episodes backing off 10 s
    side by side advance the clock by 10 s, not 20. ``sleeps`` records every wait asked for;
    :meth:`at` runs a function once the clock reaches a time (a server coming back up).
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._alarms: list[tuple[float, Callable[[], object]]] = []

    def __call__(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], object]) -> None:
        self._alarms.append((when, action))

    async def sleep(self, seconds: float) -> None:
        wake = self.now + seconds
        self.sleeps.append(seconds)
        await anyio.lowlevel.checkpoint()
        self.now = max(self.now, wake)
        due = [a for a in self._alarms if a[0] <= self.now]
        self._alarms = [a for a in self._alarms if a[0] > self.now]
        for _, action in due:
            action()
