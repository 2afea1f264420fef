"""Set-ups shared across processes and nodes: a named Ray actor per run and snapshot scope.

A :class:`~sandlot.sandboxes.setups.cache.SetupCache` given a :class:`SharedSetups` asks one
:class:`~sandlot.sandboxes.setups.table.SetupTable`, held by a named actor, who sets a key up:
the first sample of the key in any process builds and publishes a :class:`SnapshotRef`, the
others wait for it and fork it, each fork holding a lease on the snapshot. Where a snapshot can
be opened decides where the actor lives (``Transport.snapshot_scope``): ``"node"`` snapshots
(``local`` directories, ``docker`` images of the node's engine) are shared by the processes of
one node through ``sandlot-setups-<run id>-<node id>``, pinned to that node; ``"global"`` ones
(Modal images) by the whole cluster through ``sandlot-setups-<run id>-cluster``. The actor
deletes the snapshots: an evicted one once its last fork closed, all of them when the last
process of the run detached (:meth:`SharedSetups.aclose`); a process killed outright never
detaches, and ``sandlot gc --run-id`` removes what its actor kept.

Written against Ray 2.x (``ray.remote``, ``.options(name=, namespace=, get_if_exists=,
lifetime=, scheduling_strategy=)``, ``NodeAffinitySchedulingStrategy``, async actors;
https://docs.ray.io/en/latest/ray-core/actors/named-actors.html,
https://docs.ray.io/en/latest/ray-core/scheduling/index.html#nodeaffinityschedulingstrategy).
Ray is imported only when an actor is first needed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from pydantic import BaseModel

from sandlot.sandboxes.labels import run_id
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.setups.table import Claim, SetupTable
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

NAMESPACE = "sandlot"

log = logging.getLogger("sandlot.sandboxes")


@dataclass(frozen=True)
class SnapshotRef:
    """A native snapshot as another process opens it (pickled by Ray; it holds the options,
    secrets included, so it is never logged)."""

    backend: str
    spec: SandboxSpec
    options: BaseModel
    handle: str

    @classmethod
    def of(cls, snapshot: Snapshot, backend: str) -> SnapshotRef:
        """The reference of a native ``snapshot`` of the backend registered as ``backend``."""
        assert snapshot.handle is not None, "a fallback snapshot is not shared"
        return cls(backend, snapshot.spec, snapshot.options, snapshot.handle)

    def snapshot(self) -> Snapshot:
        """A :class:`Snapshot` of this process for the reference (deleting it deletes it)."""
        return Snapshot(get_backend(self.backend), self.spec, self.options, self.handle)

    def leased(self, give_back: Callable[[], Awaitable[None]]) -> LeasedSnapshot:
        """The snapshot for one fork that holds a lease on it (``give_back`` returns it)."""
        backend = get_backend(self.backend)
        return LeasedSnapshot(backend, self.spec, self.options, self.handle, give_back=give_back)


@dataclass(eq=False)
class LeasedSnapshot(Snapshot):
    """One fork's hold on a shared snapshot: the fork's close gives its lease back; the actor,
    not this process, deletes the snapshot."""

    give_back: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def _release(self) -> None:
        self._forks -= 1
        await self.release_lease()

    async def release_lease(self) -> None:
        """Give the lease back (once; also for a fork that failed before it held it)."""
        give_back, self.give_back = self.give_back, None
        if give_back is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await give_back()
            except Exception as exc:  # a Ray error: the actor died with its leases
                log.warning("giving back the lease on snapshot %s failed: %s", self.handle, exc)

    async def _remove(self) -> None:
        """Nothing: the registry's actor deletes shared snapshots."""


class SetupActor:
    """A :class:`SetupTable` and the deletion of what it gives up: what a
    :class:`~sandlot.sandboxes.setups.cache.SetupCache` asks, in its own process or hosted by
    a named Ray actor (:class:`SharedSetups`). Every method is a coroutine, so both are
    called alike (``await``; :class:`RemoteSetups` wraps the Ray handle).

    Args:
        max_snapshots: how many ready snapshots the table keeps (>= 1).
    """

    def __init__(self, max_snapshots: int) -> None:
        self._table: SetupTable[SnapshotRef] = SetupTable(max_snapshots)
        self._clients: set[str] = set()
        self._published: anyio.Event | None = None

    async def attach(self, client: str) -> None:
        self._clients.add(client)

    async def detach(self, client: str) -> bool:
        """``client`` is done; the last one deletes every snapshot (``True``: it was last)."""
        self._clients.discard(client)
        if self._clients:
            return False
        await _delete(self._table.close())
        return True

    async def claim(self, key: str, holder: str, lease_s: float) -> Claim:
        return self._table.claim(key, holder, lease_s)

    async def renew(self, key: str, holder: str, lease_s: float) -> bool:
        return self._table.renew(key, holder, lease_s)

    async def wait(self, timeout_s: float) -> None:
        """Return at the next ``publish`` of any key, or after ``timeout_s`` seconds (a
        waiter claims again: its key may be ready, or its builder's lease run out)."""
        if self._published is None:
            self._published = anyio.Event()
        with anyio.move_on_after(timeout_s):
            await self._published.wait()

    async def publish(
        self,
        key: str,
        holder: str,
        ref: SnapshotRef | None,
        group_size: int | None,
        lease: str | None,
    ) -> None:
        deleted = self._table.publish(key, holder, ref, group_size=group_size, lease=lease)
        if self._published is not None:
            self._published.set()
            self._published = None
        await _delete(deleted)

    async def acquire(self, key: str, lease: str) -> SnapshotRef | None:
        return self._table.acquire(key, lease)

    async def release(self, lease: str) -> None:
        await _delete(self._table.release(lease))

    async def drop(self, prefix: str) -> None:
        await _delete(self._table.drop(prefix))


async def _delete(refs: list[SnapshotRef]) -> None:
    for ref in refs:
        await ref.snapshot().delete()  # logged, not raised, when it fails


class RemoteSetups:
    """A Ray handle of a :class:`SetupActor`, called as the actor itself is
    (``await remote.claim(...)`` is ``await handle.claim.remote(...)``)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._handle, name)

        async def call(*args: Any) -> Any:
            return await method.remote(*args)

        return call


class SharedSetups:
    """This process's handle on the run's set-up registry (needs Ray initialised).

    Args:
        run: the run whose actors to use (default: this process's run id, which Ray's workers
            inherit as ``SANDLOT_RUN_ID``).
        max_snapshots: how many ready snapshots an actor keeps (for the actor that is created).
    """

    def __init__(self, run: str | None = None, *, max_snapshots: int = 64) -> None:
        self.run = run or run_id()
        self.max_snapshots = max_snapshots
        self._client = uuid.uuid4().hex
        self._actors: dict[str, Any] = {}

    async def setups(self, backend: str) -> SetupActor:
        """The actor that shares ``backend``'s snapshots (created on first use, pinned to this
        node for ``"node"`` scope, one for the cluster for ``"global"``), called as a
        :class:`SetupActor` of this process is."""
        return cast(SetupActor, RemoteSetups(await self._actor(backend)))

    async def _actor(self, backend: str) -> Any:
        scope = get_backend(backend).snapshot_scope
        if scope not in self._actors:
            import ray

            options: dict[str, Any] = {}
            if scope == "node":
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                node = ray.get_runtime_context().get_node_id()
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
                name = f"sandlot-setups-{self.run}-{node}"
            else:
                name = f"sandlot-setups-{self.run}-cluster"
            actor: Any = (
                ray.remote(num_cpus=0)(SetupActor)
                .options(
                    name=name,
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    **options,
                )
                .remote(self.max_snapshots)
            )
            self._actors[scope] = actor  # before awaiting: concurrent samples reuse it
            await actor.attach.remote(self._client)
        return self._actors[scope]

    async def aclose(self) -> None:
        """Detach from the actors; the last process of the run deletes their snapshots and
        ends them. Idempotent; finishes under cancellation."""
        actors, self._actors = list(self._actors.values()), {}
        with anyio.CancelScope(shield=True):
            for actor in actors:
                try:
                    if await actor.detach.remote(self._client):
                        import ray

                        ray.kill(actor)
                except Exception as exc:  # a Ray error: the actor died with its table
                    log.warning(
                        "detaching from the shared set-ups failed (%s); `sandlot gc --run-id "
                        "%s` removes the snapshots left",
                        exc,
                        self.run,
                    )
