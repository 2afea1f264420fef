"""``SetupCache``: the samples of one key share one set-up (GRPO groups, ``sandlot rollout -n``
and its gradings, the verl agent loop, ``sandlot eval`` of several prediction files).

The first sample of a key (instance, spec, backend, options, and what the set-up is for) opens
a sandbox, sets it up (``prepare``: e.g. the repository at ``base_commit``, the graded files
removed), freezes it with :meth:`Sandbox.snapshot <sandlot.sandboxes.base.Sandbox.snapshot>`
and runs in it; the other samples of the key wait for that, then start forks of the snapshot
(``sandlot.open(snapshot=)``) that skip the set-up. With ``fork_first`` the set-up sandbox is
closed once frozen and the first sample runs in a fork too, so every sample starts from the
same files and none where the set-up's processes still run (gradings). A set-up or snapshot
that fails, a backend without ``supports_snapshot``, a snapshot already evicted and a fork that
fails to start all fall back to the per-sample set-up (logged), never failing a sample that
would have run without the cache.

Who sets a key up, who waits and when a snapshot goes is decided by one state machine,
:class:`~sandlot.sandboxes.setups.table.SetupTable`, through a
:class:`~sandlot.sandboxes.setups.actor.SetupActor`: one of this cache's own (the samples of
one event loop: ``InProcessEpisodes``, one verl agent-loop worker, one ``sandlot eval``), or
with ``shared`` the run's named Ray actor, so the caches of the run's processes share their
set-ups (:mod:`sandlot.sandboxes.setups.actor`). Each fork holds a lease on its snapshot; an
evicted snapshot is deleted once no fork holds it. At most ``max_snapshots`` are kept (the
oldest evicted first); a caller that knows how many samples a key has (verl's ``rollout.n``,
the prediction files of an instance) passes ``group_size``: the snapshot is evicted once that
many opened, and a key of one sample is set up without a snapshot. ``aclose()`` deletes the
rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.sandboxes.setups.actor import SetupActor, SharedSetups, SnapshotRef
from sandlot.sandboxes.setups.counts import SetupCounts
from sandlot.sandboxes.setups.table import Claim
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandlot.sandboxes")
_POLL_FIRST_S = 0.05  # a waiter claims again after this, doubling up to 1 s (or at a publish)
_POLL_MAX_S = 1.0

Prepare = Callable[[Sandbox], Awaitable[None]]
"""Sets a started sandbox up for an episode; raises on failure."""


@dataclass(frozen=True)
class _Sample:
    """One ``SetupCache.open``: what to open, how to set it up, and its group."""

    key: str
    backend: str
    spec: SandboxSpec
    options: BaseModel
    prepare: Prepare
    group_size: int | None
    fork_first: bool


def setup_key(
    instance_id: str, backend: str, spec: SandboxSpec, options: BaseModel, purpose: str = ""
) -> str:
    """The cache key of a set-up: the instance, the backend, a digest of spec and options,
    and ``purpose`` (set-ups that prepare differently, such as an agent's and a grading's,
    must not share a key)."""
    described = json.dumps([spec.model_dump(mode="json"), options.model_dump(mode="json")])
    digest = hashlib.sha256(described.encode()).hexdigest()[:16]
    return f"{instance_id}/{backend}/{digest}" + (f"/{purpose}" if purpose else "")


class SetupCache:
    """Snapshots of set-up sandboxes, by key (see the module docstring).

    Args:
        max_snapshots: how many this cache's own table keeps at most (>= 1; a shared table's
            is ``shared.max_snapshots``).
        shared: share the set-ups with the run's other processes through its Ray actors
            (:mod:`sandlot.sandboxes.setups.actor`); ``None``: within this cache only.
        wait_s: how long a sample waits for another's set-up before setting up alone.
        lease_s: a builder that has not renewed its build for this long (its process died) is
            given up: its waiters set up alone.

    Attributes:
        counts: the sandboxes this cache set up and forked (a fork that failed to start is
            not counted; its sample's set-up is).
    """

    def __init__(
        self,
        max_snapshots: int = 64,
        *,
        shared: SharedSetups | None = None,
        wait_s: float = 1800.0,
        lease_s: float = 30.0,
    ) -> None:
        self.shared = shared
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.counts = SetupCounts()
        self._client = uuid.uuid4().hex
        self._own: SetupActor | None = None if shared else SetupActor(max_snapshots)

    async def open(
        self,
        key: str,
        backend: str,
        spec: SandboxSpec,
        options: BaseModel,
        prepare: Prepare,
        *,
        group_size: int | None = None,
        fork_first: bool = False,
    ) -> Sandbox:
        """A started sandbox of ``spec`` that ``prepare`` set up, or a fork of one; the caller
        closes it. ``prepare`` runs only in a sandbox this call sets up (so a caller counts its
        own set-ups there); ``sb.origin`` is set on a fork.

        Args:
            key: what the samples that share a set-up share (:func:`setup_key`).
            backend / spec / options: what to open.
            prepare: sets a started sandbox up.
            group_size: how many samples of ``key`` open through the table (``None``:
                unknown); the ``group_size``-th open evicts the snapshot (the forks running
                keep their files) and a later open sets up anew. 1: no snapshot.
            fork_first: the sample that sets up closes its set-up sandbox once frozen and
                runs in a fork of it.

        Raises:
            SandboxError: as ``Sandbox.start`` or ``prepare`` (the sandbox is closed first).
            Exception: what ``prepare`` raised.
        """
        one = _Sample(key, backend, spec, options, prepare, group_size, fork_first)
        if group_size is not None and group_size <= 1:  # a group of one: nothing to share
            return await self._set_up(one)
        holder = uuid.uuid4().hex
        try:
            setups = await self._setups(backend)
            state = await self._claim(setups, key, holder)
        except Exception as exc:  # a Ray error: the actor is gone or unreachable
            log.warning("no shared set-up for %s (its table failed: %s), setting up", key, exc)
            return await self._set_up(one)
        if state == "build":
            sb = await self._build(setups, one, holder)
            if sb is not None:
                return sb
        elif state == "ready":
            fork = await self._fork(setups, one)
            if fork is not None:
                return fork
        else:
            why = "its build failed or its builder died" if state == "failed" else "waited too long"
            log.warning("no shared set-up for %s (%s), setting this sample up", key, why)
        return await self._set_up(one)

    async def _setups(self, backend: str) -> SetupActor:
        if self._own is not None:
            return self._own
        assert self.shared is not None
        return await self.shared.setups(backend)

    async def _claim(self, setups: SetupActor, key: str, holder: str) -> Claim | None:
        """``"build"``, ``"ready"``, ``"failed"``, or ``None`` when the wait ran out."""
        deadline = anyio.current_time() + self.wait_s
        delay = _POLL_FIRST_S
        while True:
            state = await setups.claim(key, holder, self.lease_s)
            if state != "wait":
                return state
            if anyio.current_time() >= deadline:
                return None
            await setups.wait(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    async def _build(self, setups: SetupActor, one: _Sample, holder: str) -> Sandbox | None:
        """Set ``one``'s key up and publish its snapshot (nothing when the build failed: its
        waiters set up alone), renewing the build's lease meanwhile. Returns the set-up
        sandbox, or with ``fork_first`` a fork (``None``: set up alone)."""
        key = one.key

        async def renew() -> None:  # until cancelled, or the build was given up
            with contextlib.suppress(Exception):  # the actor is gone: nobody waits any more
                renewed = True
                while renewed:
                    await anyio.sleep(self.lease_s / 3)
                    renewed = await setups.renew(key, holder, self.lease_s)

        failure: Exception | None = None
        sb: Sandbox | None = None
        snapshot: Snapshot | None = None
        ref: SnapshotRef | None = None
        lease = uuid.uuid4().hex if one.fork_first else None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(renew)
                try:
                    sb = await self._set_up(one)
                    snapshot = await self._freeze(sb, key)
                except Exception as exc:  # raised as itself, not in the group's ExceptionGroup
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            ref = SnapshotRef.of(snapshot, one.backend) if snapshot is not None else None
        except BaseException:  # failed or cancelled: nothing of the build outlives it
            with anyio.CancelScope(shield=True):
                if snapshot is not None:
                    await snapshot.delete()
                if sb is not None:
                    await sb.close()
            raise
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await setups.publish(key, holder, ref, one.group_size, lease if ref else None)
                except Exception as exc:  # the waiters give the build up when its lease ends
                    log.warning("cannot publish the set-up of %s (%s), not shared", key, exc)
                    if ref is not None:
                        await ref.snapshot().delete()
                    ref = None
        assert sb is not None  # set up, else raised
        if ref is None or lease is None:
            return sb
        await sb.close()
        return await self._start_fork(setups, one, ref, lease)

    async def _fork(self, setups: SetupActor, one: _Sample) -> Sandbox | None:
        """A started fork of ``one``'s key's snapshot; ``None`` when the snapshot was evicted
        meanwhile, the table is unreachable or the fork failed to start."""
        lease = uuid.uuid4().hex
        try:
            ref = await setups.acquire(one.key, lease)
        except Exception as exc:  # a Ray error: the actor is gone or unreachable
            log.warning("cannot fork the shared set-up of %s (%s), setting up", one.key, exc)
            return None
        if ref is None:
            return None
        return await self._start_fork(setups, one, ref, lease)

    async def _start_fork(
        self, setups: SetupActor, one: _Sample, ref: SnapshotRef, lease: str
    ) -> Sandbox | None:
        """A started fork of ``ref`` holding ``lease`` (given back when it closes); ``None``
        (logged) when its start failed, so the sample sets up on its own."""

        async def give_back() -> None:
            await setups.release(lease)

        snapshot = ref.leased(give_back)
        fork = open_sandbox(one.backend, one.spec, options=one.options, snapshot=snapshot)
        try:
            await fork.start()
        except Exception as exc:
            log.warning(
                "a fork of the set-up of %s failed to start, setting up anew: %s", one.key, exc
            )
            await snapshot.release_lease()  # a fork that failed before holding it
            return None
        self.counts.forked += 1
        return fork

    async def _set_up(self, one: _Sample) -> Sandbox:
        sb = open_sandbox(one.backend, one.spec, options=one.options)
        try:
            await sb.start()
            self.counts.set_up += 1
            await one.prepare(sb)
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

    async def release(self, instance_id: str, backend: str) -> None:
        """The samples of ``instance_id`` on ``backend`` are done (a batch ended): evict its
        set-ups now, for a caller that knows no group size (verl's validation prompts), rather
        than when evicted for room; a later sample sets up anew. A failure is logged."""
        try:
            setups = await self._setups(backend)
            await setups.drop(f"{instance_id}/{backend}/")
        except Exception as exc:  # a Ray error: left to eviction and the run's end
            log.warning("cannot release the set-ups of %s (%s)", instance_id, exc)

    async def aclose(self) -> None:
        """Delete every snapshot of this cache's table, or detach from the shared ones (the
        run's last process deletes them); each is removed when its last fork closes.
        Idempotent, finishes under cancellation. Use the cache as
        ``async with contextlib.aclosing(SetupCache())``."""
        with anyio.CancelScope(shield=True):
            if self._own is not None:
                await self._own.detach(self._client)
            elif self.shared is not None:
                await self.shared.aclose()
