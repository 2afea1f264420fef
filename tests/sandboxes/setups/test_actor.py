"""Set-ups shared across processes: two Ray actors (their own processes) share one set-up on
``local`` through the run's registry actor, a builder killed mid-build is given up, and
snapshots any node opens are shared by one table for the cluster."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from repo_paths import TESTS
from requirements import TRAIN, need_module
from setups_helpers import OPTIONS, SPEC, ready

from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.local.reaper import LocalReaper
from sandlot.sandboxes.setups.actor import SharedSetups
from sandlot.sandboxes.setups.cache import SetupCache


class Sampler:
    """A Ray actor (its own process) opening samples through a shared ``SetupCache``."""

    def __init__(self, root: str, run: str, lease_s: float) -> None:
        os.environ["SANDLOT_LOCAL_ROOT"] = root
        # no wait deadline in effect: a waiter falls back only through the builder's lease
        self.cache = SetupCache(shared=SharedSetups(run), lease_s=lease_s, wait_s=3600)
        self.sandboxes: list[Any] = []
        self.building = False

    async def open(self, n: int, setup: str) -> list[bool]:
        """Open ``n`` samples of one key concurrently; which of them are forks."""

        async def prepare(sb: Any) -> None:
            self.building = True
            await sb.exec(setup)

        async def one() -> None:
            sb = await self.cache.open("k", "local", SPEC, OPTIONS, prepare)
            self.sandboxes.append(sb)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
        for sb in self.sandboxes:
            assert b"ready" in await sb.read_file("ready.txt")
        return [sb.origin is not None for sb in self.sandboxes]

    def is_building(self) -> bool:
        return self.building

    async def close(self) -> int:
        for sb in self.sandboxes:
            await sb.close()
        await self.cache.aclose()
        return self.cache.counts.set_up


@pytest.mark.slow
def test_two_processes_share_one_set_up_and_a_dead_builder_is_given_up(
    local_root: Path,
) -> None:
    ray = need_module("ray", TRAIN)
    # The workers import this module (``Sampler``) by name, and it imports ``repo_paths``.
    here = str(Path(__file__).parent)
    path = os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(TESTS), here])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        remote = ray.remote(num_cpus=0)(Sampler)
        setup = "sleep 1 && echo ready > ready.txt"
        a, b = (remote.remote(str(local_root), "shared", 30.0) for _ in range(2))
        forks = ray.get([a.open.remote(2, setup), b.open.remote(2, setup)])
        assert sorted(forks[0] + forks[1]) == [False, True, True, True]
        assert all(any(f) for f in forks), "a fork in each process"
        assert ray.get([a.close.remote(), b.close.remote()]) in ([1, 0], [0, 1])
        assert not list(local_root.iterdir()), "the last detach deleted the snapshot"
        with pytest.raises(ValueError):
            ray.get_actor(f"sandlot-setups-shared-{ray.get_runtime_context().get_node_id()}")

        # The builder's process dies mid-build: the waiter sets up alone once its lease ran out.
        dying, waiting = (remote.remote(str(local_root), "dying", 2.0) for _ in range(2))
        dying.open.remote(1, "sleep 600")
        while not ray.get(dying.is_building.remote()):
            time.sleep(0.05)
        ray.kill(dying)
        assert ray.get(waiting.open.remote(1, "echo ready > ready.txt")) == [False]
        assert ray.get(waiting.close.remote()) == 1
    finally:
        ray.shutdown()
    # the killed builder's sandbox is what `sandlot gc` removes after a crash
    reaper = LocalReaper(str(local_root))
    for sandbox in anyio.run(reaper.list_sandboxes):
        anyio.run(reaper.kill, sandbox)


@pytest.mark.slow
def test_global_snapshots_are_shared_by_one_table_for_the_cluster(
    local_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend whose snapshot any node opens (Modal's image ids; here ``local`` told so) is
    shared through ``sandlot-setups-<run>-cluster``, not a table per node."""
    ray = need_module("ray", TRAIN)
    monkeypatch.setattr(LocalSandbox, "snapshot_scope", "global")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        node = ray.get_runtime_context().get_node_id()

        async def group() -> list[bool]:
            cache = SetupCache(shared=SharedSetups("scope"))
            opened = [await cache.open("k", "local", SPEC, OPTIONS, ready) for _ in range(2)]
            assert ray.get_actor("sandlot-setups-scope-cluster", namespace="sandlot")
            with pytest.raises(ValueError):
                ray.get_actor(f"sandlot-setups-scope-{node}", namespace="sandlot")
            for sb in opened:
                await sb.close()
            await cache.aclose()
            return [sb.origin is not None for sb in opened]

        assert anyio.run(group) == [False, True]
    finally:
        ray.shutdown()
