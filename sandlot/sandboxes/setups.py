"""``SetupCache``: the samples of one key share one set-up (GRPO groups, ``sandlot rollout -n``,
the verl agent loop, ``sandlot eval`` of several prediction files).

The first sample of a key (instance, spec, backend, options) opens a sandbox, sets it up
(``prepare``: e.g. the repository at ``base_commit``, the graded files removed), freezes it
with :meth:`Sandbox.snapshot <sandlot.sandboxes.base.Sandbox.snapshot>` and runs in it; the
other samples of the key wait for that, then start forks of the snapshot
(``sandlot.open(snapshot=)``) that skip the set-up. With ``fork_first`` the set-up sandbox is
closed once frozen and the first sample runs in a fork too, so every sample starts from the
same files and none where the set-up's processes still run (graded evaluations). A set-up or
snapshot that fails, a backend without ``supports_snapshot``, a snapshot already evicted and a
fork that fails to start all fall back to the per-sample set-up (logged), never failing a
sample that would have run without the cache. At most ``max_snapshots`` are kept (the oldest
deleted first: a fork still running keeps its files); ``aclose()`` deletes the rest. A caller
that knows how many samples a key has (verl's ``rollout.n``, the prediction files of an
instance) passes ``uses``: the snapshot is deleted once that many have opened, and a key of one
sample is set up without a snapshot.

One cache serves the samples of one event loop (``InProcessEpisodes``, one verl agent-loop
worker, one ``sandlot eval``); Ray actors each set up on their own.
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

log = logging.getLogger("sandlot.sandboxes")

Prepare = Callable[[Sandbox], Awaitable[None]]
"""Sets a started sandbox up for an episode; raises on failure."""


@dataclass
class _Entry:
    ready: anyio.Event = field(default_factory=anyio.Event)
    snapshot: Snapshot | None = None
    opened: int = 0
    starting: int = 0  # forks waiting for the snapshot or starting from it


def setup_key(instance_id: str, backend: str, spec: SandboxSpec, options: BaseModel) -> str:
    """The cache key of a set-up: the instance, the backend and a digest of spec and options."""
    described = json.dumps([spec.model_dump(mode="json"), options.model_dump(mode="json")])
    return f"{instance_id}/{backend}/{hashlib.sha256(described.encode()).hexdigest()[:16]}"


class SetupCache:
    """Snapshots of set-up sandboxes, by key (see the module docstring).

    Args:
        max_snapshots: how many to keep at most (>= 1).
        fork_first: close the set-up sandbox once frozen and run the first sample in a fork.

    Attributes:
        set_ups: how many times ``prepare`` ran (one per key when every snapshot works).
        fork_failures: how many forks failed to start (each sample then set up on its own).
    """

    def __init__(self, max_snapshots: int = 64, *, fork_first: bool = False) -> None:
        if max_snapshots < 1:
            raise ValueError(f"max_snapshots must be >= 1, got {max_snapshots}")
        self.max_snapshots = max_snapshots
        self.fork_first = fork_first
        self.set_ups = 0
        self.fork_failures = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def open(
        self,
        key: str,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
        *,
        uses: int | None = None,
    ) -> Sandbox:
        """A started sandbox of ``spec`` that ``prepare`` set up, or a fork of one; the caller
        closes it. With ``uses``, the ``uses``-th open of ``key`` drops the entry and deletes
        its snapshot (the forks running keep their files); a later open sets up anew.

        Raises:
            SandboxError: as ``Sandbox.start`` or ``prepare`` (the sandbox is closed first).
            Exception: what ``prepare`` raised.
        """
        if uses is not None and uses <= 1:  # a group of one: nothing to share
            return await self._set_up(backend, spec, options, prepare)
        entry = self._entries.get(key)
        if entry is None:
            # With fork_first the first sample counts as starting from the outset: a sibling
            # whose fork starts while the set-up sandbox closes must not delete the snapshot.
            entry = self._entries[key] = _Entry(opened=1, starting=int(self.fork_first))
            try:
                sb = await self._set_up(backend, spec, options, prepare)
                try:
                    entry.snapshot = await self._freeze(sb, key)
                except BaseException:  # cancelled while freezing: the sandbox is closed too
                    await sb.close()
                    raise
            except BaseException:
                entry.starting -= self.fork_first  # its own count; waiters keep theirs
                raise
            finally:
                entry.ready.set()
            await self._evict()
            if not self.fork_first or entry.snapshot is None:
                entry.starting -= self.fork_first
                return sb
            # Its set-up is in the snapshot: closed, and the first sample forks too.
            return await self._fork(key, entry, backend, spec, options, prepare, uses, first=sb)
        return await self._fork(key, entry, backend, spec, options, prepare, uses)

    async def _fork(
        self,
        key: str,
        entry: _Entry,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
        uses: int | None,
        *,
        first: Sandbox | None = None,
    ) -> Sandbox:
        """A fork of ``entry``'s snapshot once it is ready, else a sandbox set up anew
        (``first``: the set-up sandbox of the sample that made it, already counted, closed
        here)."""
        if first is None:
            entry.opened += 1
            entry.starting += 1
        if uses is not None and entry.opened >= uses and self._entries.get(key) is entry:
            del self._entries[key]  # the key's last sample: no fork of it opens after this
        try:
            if first is not None:
                await first.close()
            await entry.ready.wait()
            snapshot = entry.snapshot
            if snapshot is not None and not snapshot.deleted:
                fork = await self._start_fork(key, backend, spec, options, snapshot)
                if fork is not None:
                    return fork
        finally:
            entry.starting -= 1
            dropped = self._entries.get(key) is not entry
            if dropped and entry.starting == 0 and entry.snapshot is not None:
                await entry.snapshot.delete()  # removed when the last running fork closes
        return await self._set_up(backend, spec, options, prepare)

    async def _start_fork(
        self, key: str, backend: str, spec: SandboxSpec, options: BaseModel, snapshot: Snapshot
    ) -> Sandbox | None:
        """A started fork of ``snapshot``; ``None`` (logged, counted) when its start failed,
        so the sample sets up on its own (the fork closed itself)."""
        fork = open_sandbox(backend, spec, options=options, snapshot=snapshot)
        try:
            await fork.start()
        except Exception as exc:
            self.fork_failures += 1
            log.warning("a fork of the set-up of %s failed to start, setting up anew: %s", key, exc)
            return None
        return fork

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
