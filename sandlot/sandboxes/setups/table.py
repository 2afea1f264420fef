"""``SetupTable``: who sets a key up, and which snapshots may be deleted, across processes.

The logic of the shared set-up registry (:mod:`sandlot.sandboxes.setups.actor` runs it in a
named Ray actor), plain Python so that it is testable without Ray. Per key, the first
``claim`` makes its caller the *builder*; the others ``wait`` until the builder publishes a
snapshot (``ready``) or nothing (``failed``: each sample sets itself up). A build is a lease
the builder renews while it works (``renew``): a builder whose process died stops renewing,
and the next ``claim`` after the lease ran out finds the key ``failed`` rather than waiting for
ever. A fork holds a lease on its snapshot (``acquire`` / ``release``): an evicted snapshot
(more than ``max_snapshots`` ready, or its key's ``group_size`` samples opened) is deleted
once no fork of any process holds it. The table never deletes anything itself: the snapshots
its calls return are the caller's to delete.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

Ref = TypeVar("Ref")
"""What describes a snapshot to the processes that fork it (a ``SnapshotRef``)."""

Claim = Literal["build", "wait", "ready", "failed"]


@dataclass(eq=False)
class _Held(Generic[Ref]):
    ref: Ref
    leases: set[str] = field(default_factory=set)
    evicted: bool = False


@dataclass
class _Key(Generic[Ref]):
    builder: str
    expires: float
    held: _Held[Ref] | None = None
    state: Literal["building", "ready", "failed"] = "building"
    opened: int = 0
    group_size: int | None = None


class SetupTable(Generic[Ref]):
    """The keys being set up and the snapshots forks hold (see the module docstring).

    Args:
        max_snapshots: how many ready snapshots to keep at most (>= 1), the oldest evicted first.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, max_snapshots: int = 64, clock: Callable[[], float] = time.monotonic):
        if max_snapshots < 1:
            raise ValueError(f"max_snapshots must be >= 1, got {max_snapshots}")
        self.max_snapshots = max_snapshots
        self._clock = clock
        self._keys: OrderedDict[str, _Key[Ref]] = OrderedDict()
        self._held: set[_Held[Ref]] = set()  # every snapshot not deleted yet
        self._leases: dict[str, _Held[Ref]] = {}

    def claim(self, key: str, holder: str, lease_s: float) -> Claim:
        """What ``holder`` does for ``key``: ``"build"`` (it builds, for ``lease_s`` seconds
        unless renewed), ``"wait"``, ``"ready"`` (``acquire`` the snapshot) or ``"failed"``
        (set up alone)."""
        entry = self._keys.get(key)
        now = self._clock()
        if entry is None:
            self._keys[key] = _Key(builder=holder, expires=now + lease_s)
            return "build"
        if entry.state == "building" and entry.expires <= now:
            entry.state = "failed"  # the builder stopped renewing: its process died
        if entry.state == "building":
            return "wait"
        return entry.state

    def renew(self, key: str, holder: str, lease_s: float) -> bool:
        """Extend ``holder``'s build of ``key`` by ``lease_s`` seconds; ``False`` when it is
        no longer the builder (its lease ran out)."""
        entry = self._keys.get(key)
        if entry is None or entry.state != "building" or entry.builder != holder:
            return False
        entry.expires = self._clock() + lease_s
        return True

    def publish(
        self, key: str, holder: str, ref: Ref | None, *, group_size: int | None, lease: str | None
    ) -> list[Ref]:
        """``holder`` finished building ``key``: ``ref`` is its snapshot (``None``: no
        snapshot, the key's samples set up alone). The builder's sample counts as the first of
        the key's ``group_size`` (``None``: unknown); with ``lease`` it forks the snapshot too
        and holds it under that lease until ``release``. Returns the snapshots to delete
        (``ref`` itself when the build had been given up, the ones evicted to make room)."""
        entry = self._keys.get(key)
        if entry is None or entry.state != "building" or entry.builder != holder:
            return [ref] if ref is not None else []
        if ref is None:
            entry.state = "failed"
            return []
        entry.state, entry.held, entry.group_size = "ready", _Held(ref), group_size
        self._held.add(entry.held)
        if lease is not None:
            self._hold(entry.held, lease)
        entry.opened = 1
        if group_size is not None and group_size <= 1:
            return self._evict(key)
        ready = [k for k, e in self._keys.items() if e.state == "ready"]
        return [r for k in ready[: max(0, len(ready) - self.max_snapshots)] for r in self._evict(k)]

    def acquire(self, key: str, lease: str) -> Ref | None:
        """A fork of ``key``'s snapshot starts: hold it under ``lease`` until ``release``.
        ``None`` when the key has no snapshot (any more): set up alone."""
        entry = self._keys.get(key)
        if entry is None or entry.held is None:
            return None
        held = entry.held
        self._hold(held, lease)
        entry.opened += 1
        if entry.group_size is not None and entry.opened >= entry.group_size:
            self._evict(key)  # held: deleted at its last release
        return held.ref

    def _hold(self, held: _Held[Ref], lease: str) -> None:
        held.leases.add(lease)
        self._leases[lease] = held

    def release(self, lease: str) -> list[Ref]:
        """A fork closed; returns its snapshot when that was evicted and this its last lease."""
        held = self._leases.pop(lease, None)
        if held is None:
            return []
        held.leases.discard(lease)
        return self._drop(held) if held.evicted else []

    def drop(self, prefix: str) -> list[Ref]:
        """Evict every set-up key starting with ``prefix`` (the samples that needed them are
        done; one being built is left to its builder); returns the snapshots no fork holds."""
        done = [k for k, e in self._keys.items() if k.startswith(prefix) and e.state != "building"]
        return [ref for key in done for ref in self._evict(key)]

    def close(self) -> list[Ref]:
        """Forget everything; returns every snapshot (the run is over: all are deleted)."""
        refs = [held.ref for held in self._held]
        self._keys.clear()
        self._held.clear()
        self._leases.clear()
        return refs

    def _evict(self, key: str) -> list[Ref]:
        """Drop ``key`` (a later claim builds anew); its snapshot, if no fork holds it."""
        held = self._keys.pop(key).held
        if held is None:
            return []
        held.evicted = True
        return self._drop(held)

    def _drop(self, held: _Held[Ref]) -> list[Ref]:
        """``held``'s snapshot to delete, unless a fork still holds it."""
        if held.leases or held not in self._held:
            return []
        self._held.discard(held)
        return [held.ref]
