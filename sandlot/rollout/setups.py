"""``SetupCache``: the samples of one row share one set-up (GRPO groups, ``sandlot rollout -n``).

The first sample of a key (instance, spec, backend, options) opens a sandbox, sets it up
(``prepare``: the repository at ``base_commit``, the graded files removed), freezes it with
:meth:`Sandbox.snapshot <sandlot.sandboxes.base.Sandbox.snapshot>` and runs its episode in
it; the other samples of the key wait for that, then start forks of the snapshot
(``sandlot.open(snapshot=)``) that skip the set-up. A set-up or snapshot that fails, a
backend without ``supports_snapshot``, and a snapshot already evicted all fall back to the
per-sample set-up, never failing a sample that would have run without the cache. At most
``max_snapshots`` are kept (the oldest deleted first: a fork still running keeps its files);
``aclose()`` deletes the rest.

One cache serves the episodes of one event loop (``InProcessEpisodes``); Ray actors each
set up on their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandlot.rollout")

Prepare = Callable[[Sandbox], Awaitable[None]]
"""Sets a started sandbox up for an episode; raises on failure."""


@dataclass
class _Entry:
    ready: anyio.Event = field(default_factory=anyio.Event)
    snapshot: Snapshot | None = None


def setup_key(instance_id: str, backend: str, spec: SandboxSpec, options: BaseModel) -> str:
    """The cache key of a set-up: the instance, the backend and a digest of spec and options."""
    described = json.dumps([spec.model_dump(mode="json"), options.model_dump(mode="json")])
    return f"{instance_id}/{backend}/{hashlib.sha256(described.encode()).hexdigest()[:16]}"


class SetupCache:
    """Snapshots of set-up sandboxes, by key (see the module docstring).

    Args:
        max_snapshots: how many to keep at most (>= 1).

    Attributes:
        set_ups: how many times ``prepare`` ran (one per key when every snapshot works).
    """

    def __init__(self, max_snapshots: int = 64) -> None:
        if max_snapshots < 1:
            raise ValueError(f"max_snapshots must be >= 1, got {max_snapshots}")
        self.max_snapshots = max_snapshots
        self.set_ups = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def open(
        self,
        key: str,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
    ) -> Sandbox:
        """A started sandbox of ``spec`` that ``prepare`` set up, or a fork of one; the caller
        closes it.

        Raises:
            SandboxError: as ``Sandbox.start`` or ``prepare`` (the sandbox is closed first).
            Exception: what ``prepare`` raised.
        """
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
            try:
                sb = await self._set_up(backend, spec, options, prepare)
                entry.snapshot = await self._freeze(sb, key)
            finally:
                entry.ready.set()
            await self._evict()
            return sb
        await entry.ready.wait()
        if entry.snapshot is not None and not entry.snapshot.deleted:
            fork = open_sandbox(backend, spec, options=options, snapshot=entry.snapshot)
            await fork.start()
            return fork
        return await self._set_up(backend, spec, options, prepare)

    async def _set_up(
        self, backend: str, spec: SandboxSpec, options: BaseModel, prepare: Prepare
    ) -> Sandbox:
        sb = open_sandbox(backend, spec, options=options)
        try:
            await sb.start()
            self.set_ups += 1
            await prepare(sb)
        except BaseException:
            await sb.close()
            raise
        return sb

    async def _freeze(self, sb: Sandbox, key: str) -> Snapshot | None:
        if not sb.supports_snapshot:
            return None
        try:
            return await sb.snapshot()
        except SandboxError as exc:
            log.warning("cannot snapshot the set-up of %s, its samples set up each: %s", key, exc)
            return None

    async def _evict(self) -> None:
        kept = [k for k, e in self._entries.items() if e.snapshot is not None]
        for key in kept[: max(0, len(kept) - self.max_snapshots)]:
            snapshot = self._entries.pop(key).snapshot
            assert snapshot is not None
            await snapshot.delete()

    async def aclose(self) -> None:
        """Delete every snapshot (each when its last fork closes); idempotent, finishes under
        cancellation. Use the cache as ``async with contextlib.aclosing(SetupCache())``."""
        entries, self._entries = list(self._entries.values()), OrderedDict()
        with anyio.CancelScope(shield=True):
            for entry in entries:
                if entry.snapshot is not None:
                    await entry.snapshot.delete()
