"""Scale controls shared by every backend: the STARTING cap, start retries, the start budget.

Training runs open 500–2,000 sandboxes at once. What breaks first is not the number of running
sandboxes but the number being *created* at the same time: providers queue them, creates time
out, and runs die with "runtime did not start" (uni-agent PR #47 saw it at concurrency >= 128 on
Modal). So ``Sandbox.start()`` holds a *STARTING slot* from the create call until the sandbox
can run its first command (``post_setup_cmd`` runs after the slot is released):

* process-wide: one ``anyio.CapacityLimiter`` per event loop (in practice per process) of
  ``SANDLOT_MAX_STARTING`` slots;
* cluster-wide, when the process runs under Ray (``ray.is_initialized()``): one more slot from
  the named actor of :mod:`sandlot.sandboxes.scale.cluster_gate`, ``SANDLOT_CLUSTER_MAX_STARTING``
  in total.

A start that fails with a *retryable* ``SandboxError`` (rate limit, capacity, transient network)
is retried up to ``max_attempts`` times with exponential backoff and jitter, slot released while
it sleeps; a permanent error (bad image, bad credentials) fails at once. The attempts of one
start share a wall budget of ``budget_s`` seconds, counted from the first slot acquisition
(waiting in the queue for a slot does not consume it).

The two caps are process settings (:mod:`sandlot.settings`), read at each start: they size the
gate every sandbox shares, so no sandbox's spec can resize it for the others. What is one start's
own (attempts, backoff, budget) comes from ``SandboxSpec.start_limits`` when given, else from the
``SANDLOT_START_*`` variables: :class:`StartLimits`.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from anyio.lowlevel import RunVar
from pydantic import BaseModel, ConfigDict, Field

from sandlot.settings import settings


class StartLimits(BaseModel):
    """How one sandbox's start retries (the defaults: :mod:`sandlot.settings`). The STARTING
    caps are not here: they are process-wide settings (see the module docstring).

    Attributes:
        max_attempts: attempts per start; ``1`` means no retry.
        backoff_s: backoff in seconds before the 2nd attempt; doubled before each later one.
        backoff_max_s: ceiling of the backoff in seconds (before jitter).
        budget_s: wall-clock budget in seconds for all attempts of one start, from the first
            slot acquisition on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=3, ge=1)
    backoff_s: float = Field(default=2.0, ge=0)
    backoff_max_s: float = Field(default=30.0, ge=0)
    budget_s: float = Field(default=900.0, gt=0)

    @classmethod
    def from_env(cls) -> StartLimits:
        """The defaults overridden by the ``SANDLOT_*`` environment variables that are set.

        Raises:
            SettingsError: a variable is not a number (the message names it).
            pydantic.ValidationError: a value is out of range (the message names the field).
        """
        return cls.model_validate(
            settings().model_dump(include=set(cls.model_fields), exclude_none=True)
        )

    def backoff(self, retry: int) -> float:
        """Seconds to sleep before retry number ``retry`` (1 for the 2nd attempt).

        Exponential with "equal jitter": half the step is fixed, half uniformly random, so
        retries of many sandboxes that failed together spread out instead of colliding again.
        """
        step = min(self.backoff_max_s, self.backoff_s * 2 ** (retry - 1))
        return step / 2 + random.uniform(0, step / 2)


@dataclass
class StartingStats:
    """Counters of one process gate.

    Attributes:
        starting: sandboxes holding a STARTING slot now.
        peak: the highest ``starting`` seen since the gate was created (or reset).
        waiting: starts queued for a slot now.
        retries: start attempts that failed with a retryable error and were retried.
    """

    starting: int = 0
    peak: int = 0
    waiting: int = 0
    retries: int = 0


class StartingGate:
    """The STARTING cap of one event loop.

    Args:
        capacity: slots; ``0`` means unlimited.
    """

    def __init__(self, capacity: int) -> None:
        self._limiter = anyio.CapacityLimiter(capacity or 1)
        self._unlimited = capacity == 0
        self.stats = StartingStats()

    def resize(self, capacity: int) -> None:
        """Change the number of slots (``0``: unlimited); holders keep theirs."""
        self._unlimited = capacity == 0
        if capacity:
            self._limiter.total_tokens = capacity

    @asynccontextmanager
    async def slot(self, holder: object) -> AsyncIterator[None]:
        """Hold one slot for ``holder`` during the ``async with`` body."""
        acquired = False
        if not self._unlimited:
            self.stats.waiting += 1
            try:
                await self._limiter.acquire_on_behalf_of(holder)
                acquired = True
            finally:
                self.stats.waiting -= 1
        self.stats.starting += 1
        self.stats.peak = max(self.stats.peak, self.stats.starting)
        try:
            yield
        finally:
            self.stats.starting -= 1
            if acquired:
                self._limiter.release_on_behalf_of(holder)


_gate: RunVar[StartingGate] = RunVar("sandlot_starting_gate")


def starting_gate() -> StartingGate:
    """The gate of the running event loop, created on first use, sized to
    ``$SANDLOT_MAX_STARTING`` as the environment says now (``0``: unlimited; holders keep their
    slots when it shrinks).

    Raises:
        SettingsError: ``$SANDLOT_MAX_STARTING`` is not an integer >= 0.
    """
    capacity = settings().max_starting
    try:
        gate = _gate.get()
    except LookupError:
        gate = StartingGate(capacity)
        _gate.set(gate)
        return gate
    gate.resize(capacity)
    return gate


def ray_is_running() -> bool:
    """``True`` when this process is a Ray driver or worker with Ray initialised.

    Ray is never imported here: a process that did not import it is not running under it.
    """
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


@asynccontextmanager
async def starting_slot(holder: object, limits: StartLimits) -> AsyncIterator[None]:
    """Hold a process slot and, under Ray, a cluster slot while the body runs; the caps are
    the process's settings (``SANDLOT_MAX_STARTING``, ``SANDLOT_CLUSTER_MAX_STARTING``).

    The cluster slot is a lease the actor expires after ``limits.budget_s`` seconds, so a
    worker killed while holding one cannot shrink the cluster's cap for good.

    Raises:
        SettingsError: a cap's variable is not an integer >= 0.
    """
    cluster_cap = settings().cluster_max_starting
    async with starting_gate().slot(holder):
        if cluster_cap and ray_is_running():
            from sandlot.sandboxes.scale.cluster_gate import cluster_slot

            async with cluster_slot(cluster_cap, lease_s=limits.budget_s):
                yield
        else:
            yield


class StartClock:
    """The wall budget of one start, started at the first slot acquisition."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._deadline: float | None = None

    def remaining(self) -> float:
        """Seconds left (starting the clock on first call); never negative."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.budget_s
        return max(0.0, self._deadline - now)
