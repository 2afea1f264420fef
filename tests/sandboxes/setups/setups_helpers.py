"""Helpers of the set-up tests: caches of several "processes" on one table run in this
process, and a set-up."""

from __future__ import annotations

from typing import Any

from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.setups.actor import SetupActor, SharedSetups
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.spec import SandboxSpec

SPEC, OPTIONS = SandboxSpec(), LocalSandbox.Options()


class InProcessShared(SharedSetups):
    """The run's registry as another process sees it, its actor run in this process."""

    def __init__(self, actor: SetupActor) -> None:
        super().__init__("test")
        self.table = actor

    async def setups(self, backend: str) -> Any:
        return self.table

    async def aclose(self) -> None:
        await self.table.detach("client")


async def caches(n: int, max_snapshots: int = 4) -> list[SetupCache]:
    """``n`` caches (as of ``n`` processes) on one registry."""
    actor = SetupActor(max_snapshots)
    await actor.attach("client")
    return [SetupCache(shared=InProcessShared(actor)) for _ in range(n)]


async def ready(sb: Any) -> None:
    await sb.exec("echo ready > ready.txt")
