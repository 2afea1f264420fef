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
worker, one ``sandlot eval``); with ``shared`` the caches of the run's processes share their
set-ups through a Ray actor (:mod:`sandlot.sandboxes.setups.actor`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.sandboxes.setups.actor import SharedSetups, SnapshotRef
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandlot.sandboxes")
_POLL_FIRST_S = 0.05  # the wait for another process's set-up: polled, doubling up to 1 s
_POLL_MAX_S = 1.0

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
        shared: share the set-ups with the run's other processes through its Ray actors
            (:mod:`sandlot.sandboxes.setups.actor`, which then keeps the snapshots); ``None``:
            within this cache only.

    Attributes:
        set_ups: how many times ``prepare`` ran (one per key when every snapshot works).
        fork_failures: how many forks failed to start (each sample then set up on its own).
    """

    def __init__(
        self,
        max_snapshots: int = 64,
        *,
        fork_first: bool = False,
        shared: SharedSetups | None = None,
    ) -> None:
        if max_snapshots < 1:
            raise ValueError(f"max_snapshots must be >= 1, got {max_snapshots}")
        self.max_snapshots = max_snapshots
        self.fork_first = fork_first
        self.shared = shared
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
        if self.shared is not None:
            return await self._open_shared(self.shared, key, backend, spec, options, prepare, uses)
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

    async def _open_shared(
        self,
        shared: SharedSetups,
        key: str,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
        uses: int | None,
    ) -> Sandbox:
        """``open`` through the run's registry: build and publish the key's snapshot, or wait
        for the process that builds it and fork that; set up alone when the registry is
        unreachable, the build failed or its builder died, or the wait ran out."""
        holder = uuid.uuid4().hex
        deadline = anyio.current_time() + shared.wait_s
        delay = _POLL_FIRST_S
        try:
            actor = await shared.actor(backend)
            while True:
                state = await actor.claim.remote(key, holder, shared.lease_s)
                if state == "build":
                    break
                if state != "wait" or anyio.current_time() >= deadline:
                    break
                await anyio.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        except Exception as exc:  # a Ray error: the actor is gone or unreachable
            log.warning("no shared set-up for %s (its registry failed: %s), setting up", key, exc)
            return await self._set_up(backend, spec, options, prepare)
        if state == "build":
            sb = await self._build_shared(
                shared, actor, key, holder, backend, spec, options, prepare, uses
            )
            if sb is not None:
                return sb
        elif state == "ready":
            fork = await self._fork_shared(actor, key, backend, spec, options)
            if fork is not None:
                return fork
        else:
            why = "its build failed or its builder died" if state == "failed" else "waited too long"
            log.warning("no shared set-up for %s (%s), setting this sample up", key, why)
        return await self._set_up(backend, spec, options, prepare)

    async def _build_shared(
        self,
        shared: SharedSetups,
        actor: Any,
        key: str,
        holder: str,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
        uses: int | None,
    ) -> Sandbox | None:
        """Set ``key`` up and publish its snapshot (``None`` when the build failed: published
        as such, the waiters set up alone), renewing the build's lease meanwhile. Returns the
        set-up sandbox, or with ``fork_first`` a fork (``None``: set up alone)."""
        ref: SnapshotRef | None = None

        async def renew() -> None:  # until cancelled, or the build was given up
            with contextlib.suppress(Exception):  # the actor is gone: nobody waits any more
                renewed = True
                while renewed:
                    await anyio.sleep(shared.lease_s / 3)
                    renewed = await actor.renew.remote(key, holder, shared.lease_s)

        failure: Exception | None = None
        sb: Sandbox | None = None
        snapshot: Snapshot | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(renew)
                try:
                    sb = await self._set_up(backend, spec, options, prepare)
                    snapshot = await self._freeze(sb, key)
                except Exception as exc:  # raised as itself, not in the group's ExceptionGroup
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            ref = SnapshotRef.of(snapshot, backend) if snapshot is not None else None
        except BaseException:  # failed or cancelled: nothing of the build outlives it
            with anyio.CancelScope(shield=True):
                if snapshot is not None:
                    await snapshot.delete()
                if sb is not None:
                    await sb.close()
            raise
        finally:
            opened = 0 if self.fork_first or ref is None else 1
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                # an unreachable actor: the waiters give the build up when its lease runs out
                await actor.publish.remote(key, holder, ref, opened, uses)
        assert sb is not None  # set up, else raised
        if not self.fork_first or ref is None:
            return sb
        await sb.close()
        return await self._fork_shared(actor, key, backend, spec, options)

    async def _fork_shared(
        self, actor: Any, key: str, backend: str, spec: SandboxSpec, options: BaseModel
    ) -> Sandbox | None:
        """A started fork of ``key``'s shared snapshot under a lease of its own; ``None``
        when the snapshot was evicted meanwhile or the fork failed to start."""
        lease = uuid.uuid4().hex
        try:
            ref = await actor.acquire.remote(key, lease)
        except Exception as exc:  # a Ray error: the actor is gone or unreachable
            log.warning("cannot fork the shared set-up of %s (%s), setting up", key, exc)
            return None
        if ref is None:
            return None

        async def give_back() -> None:
            await actor.release.remote(lease)

        snapshot = ref.leased(give_back)
        fork = await self._start_fork(key, backend, spec, options, snapshot)
        if fork is None:
            await snapshot.release_lease()  # a fork that failed before holding it
        return fork

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
            if self.shared is not None:
                await self.shared.aclose()
