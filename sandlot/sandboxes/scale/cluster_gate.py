"""The cluster-wide STARTING cap: one named Ray actor holding leases on STARTING slots.

Rollout workers on Ray each run their own event loop (often one ``asyncio.run`` per task), so a
per-process cap alone does not bound what the cluster asks a provider for. Every process that
runs under Ray therefore also takes a slot from one detached-by-name actor,
``sandlot-starting-gate`` in the Ray namespace ``sandlot``, created by whichever process needs
it first (``get_if_exists=True``).

A slot is a *lease*: it expires ``lease_s`` seconds after it was taken (the start budget), so a
worker killed while starting cannot leak slots. The actor is polled (50 ms doubling to 1 s)
rather than blocked on, so a waiting process never occupies the actor.

Written against Ray 2.x (``ray.remote``, ``.options(name=, namespace=, get_if_exists=,
lifetime=)``, awaiting ``ObjectRef`` in asyncio; https://docs.ray.io/en/latest/ray-core/actors/
named-actors.html). Ray is imported only when ``ray.is_initialized()`` already holds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

ACTOR_NAME = "sandlot-starting-gate"
NAMESPACE = "sandlot"
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 1.0

_actor: Any = None


class SlotTable:
    """Leases on STARTING slots. Plain Python: the actor's logic, testable without Ray.

    Args:
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._leases: dict[str, float] = {}  # holder -> expiry time

    def try_acquire(self, holder: str, capacity: int, lease_s: float) -> bool:
        """Give ``holder`` a slot for ``lease_s`` seconds if fewer than ``capacity`` are held.

        A holder that already has a slot gets its lease renewed.
        """
        now = self._clock()
        self._leases = {h: t for h, t in self._leases.items() if t > now}
        if holder not in self._leases and len(self._leases) >= capacity:
            return False
        self._leases[holder] = now + lease_s
        return True

    def release(self, holder: str) -> None:
        """Give the slot of ``holder`` back (no-op if it has none or its lease expired)."""
        self._leases.pop(holder, None)

    def held(self) -> int:
        """Number of unexpired leases."""
        now = self._clock()
        return sum(1 for t in self._leases.values() if t > now)


def gate_actor() -> Any:
    """The handle of the cluster's gate actor, created on first use. Needs Ray initialised."""
    global _actor
    if _actor is None:
        import ray

        remote_cls = ray.remote(num_cpus=0)(SlotTable)
        _actor = remote_cls.options(
            name=ACTOR_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
        ).remote()
    return _actor


@asynccontextmanager
async def cluster_slot(capacity: int, *, lease_s: float) -> AsyncIterator[None]:
    """Hold one of the cluster's ``capacity`` STARTING slots while the body runs."""
    actor = gate_actor()
    holder = uuid.uuid4().hex
    delay = _POLL_FIRST_S
    try:
        while not await actor.try_acquire.remote(holder, capacity, lease_s):
            await anyio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await actor.release.remote(holder)
