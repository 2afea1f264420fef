"""Set-ups shared across processes: the registry's table, a ``SetupCache`` on it (the actor
run in this process), and two Ray actors sharing one set-up on ``local``."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from repo_paths import TESTS
from requirements import TRAIN, bwrap_missing, missing, need_module

from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.local.reaper import LocalReaper
from sandlot.sandboxes.setups.actor import SetupActor, SharedSetups
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.setups.table import SetupTable
from sandlot.sandboxes.spec import SandboxSpec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_builder_per_key_and_a_dead_builder_is_given_up() -> None:
    clock = Clock()
    table: SetupTable[str] = SetupTable(clock=clock)
    assert table.claim("k", "a", lease_s=10) == "build"
    assert table.claim("k", "b", lease_s=10) == "wait"
    clock.now += 8
    assert table.renew("k", "a", lease_s=10)
    clock.now += 8
    assert table.claim("k", "b", lease_s=10) == "wait", "a renewed its build"
    clock.now += 3  # a stopped renewing: its process died
    assert table.claim("k", "b", lease_s=10) == "failed"
    assert not table.renew("k", "a", lease_s=10)
    assert table.publish("k", "a", "snap", opened=1, uses=None) == ["snap"], "given up: deleted"
    assert table.acquire("k", "lease") is None


def test_a_snapshot_is_deleted_when_evicted_and_no_fork_holds_it() -> None:
    table: SetupTable[str] = SetupTable(max_snapshots=1)
    for key in ("a", "b"):
        assert table.claim(key, "builder", lease_s=10) == "build"
    assert table.publish("a", "builder", "snap-a", opened=1, uses=None) == []
    assert table.claim("a", "other", lease_s=10) == "ready"
    assert table.acquire("a", "fork-1") == "snap-a"
    assert table.publish("b", "builder", "snap-b", opened=1, uses=None) == [], "a fork holds a"
    assert table.acquire("a", "fork-2") is None, "evicted: set up alone"
    assert table.claim("a", "again", lease_s=10) == "build"
    assert table.release("fork-1") == ["snap-a"]
    assert table.release("fork-1") == []
    assert table.claim("b", "x", lease_s=10) == "ready"
    assert table.publish("a", "again", None, opened=0, uses=None) == []
    assert table.claim("a", "x", lease_s=10) == "failed"
    assert table.close() == ["snap-b"]


def test_a_key_is_dropped_once_its_uses_opened() -> None:
    table: SetupTable[str] = SetupTable()
    table.claim("k", "builder", lease_s=10)
    table.publish("k", "builder", "snap", opened=1, uses=3)
    assert table.acquire("k", "f1") == "snap" and table.acquire("k", "f2") == "snap"
    assert table.acquire("k", "f3") is None
    assert table.release("f1") == [] and table.release("f2") == ["snap"]
    assert table.close() == []


class InProcess:
    """A ``SetupActor`` called as Ray would (``handle.method.remote(...)``), in this process."""

    def __init__(self, actor: SetupActor) -> None:
        self._actor = actor

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._actor, name)

        class Remote:
            @staticmethod
            async def remote(*args: Any) -> Any:
                result = method(*args)
                return await result if inspect.isawaitable(result) else result

        return Remote


class InProcessShared(SharedSetups):
    def __init__(self, actor: SetupActor, **kwargs: Any) -> None:
        super().__init__("test", **kwargs)
        self.handle = InProcess(actor)

    async def actor(self, backend: str) -> Any:
        return self.handle

    async def aclose(self) -> None:
        await self.handle.detach.remote("client")


@pytest.fixture
def local_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The sandboxes' root, which must be empty when the test ends: every sandbox closed,
    every snapshot deleted."""
    if reason := bwrap_missing():
        missing(reason)
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(root))
    yield root
    assert not list(root.iterdir()), "a sandbox or a snapshot outlived the test"


SPEC, OPTIONS = SandboxSpec(), LocalSandbox.Options()


def caches(n: int, max_snapshots: int = 4) -> list[SetupCache]:
    """``n`` caches (as of ``n`` processes) on one registry."""
    actor = SetupActor(max_snapshots)
    actor.attach("client")
    return [SetupCache(shared=InProcessShared(actor)) for _ in range(n)]


async def ready(sb: Any) -> None:
    await sb.exec("echo ready > ready.txt")


@pytest.mark.anyio
async def test_caches_on_one_registry_set_up_once_and_the_last_detach_deletes(
    local_root: Path,
) -> None:
    one, two = caches(2)
    opened: list[Any] = []

    async def sample(cache: SetupCache) -> None:
        opened.append(await cache.open("k", "local", SPEC, OPTIONS, ready))

    async with anyio.create_task_group() as tg:
        for cache in (one, two, one, two):
            tg.start_soon(sample, cache)
    assert one.set_ups + two.set_ups == 1
    assert sorted(sb.origin is not None for sb in opened) == [False, True, True, True]
    for sb in opened:
        async with sb:
            assert b"ready" in await sb.read_file("ready.txt")
    assert await anyio.to_thread.run_sync(os.listdir, local_root), "kept for later samples"
    await one.aclose()


@pytest.mark.anyio
async def test_eviction_waits_for_the_forks_of_every_cache(local_root: Path) -> None:
    one, two = caches(2, max_snapshots=1)
    first = await one.open("a", "local", SPEC, OPTIONS, ready)
    fork = await two.open("a", "local", SPEC, OPTIONS, ready)
    assert fork.origin is not None and fork.origin.handle is not None
    await first.close()
    other = await one.open("b", "local", SPEC, OPTIONS, ready)  # evicts "a": its fork runs
    async with fork:
        assert b"ready" in await fork.read_file("ready.txt")
        assert await anyio.Path(fork.origin.handle).is_dir()
    assert not await anyio.Path(fork.origin.handle).exists(), "deleted when its last fork closed"
    await other.close()
    await one.aclose()


@pytest.mark.anyio
async def test_a_sample_cancelled_while_waiting_holds_nothing(local_root: Path) -> None:
    building = anyio.Event()
    go = anyio.Event()

    async def slow(sb: Any) -> None:
        building.set()
        await go.wait()
        await ready(sb)

    (cache,) = caches(1)
    opened: list[Any] = []

    async def sample() -> None:
        opened.append(await cache.open("k", "local", SPEC, OPTIONS, slow, uses=2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        await building.wait()
        with anyio.move_on_after(0.2):
            await cache.open("k", "local", SPEC, OPTIONS, slow, uses=2)  # waits, cancelled
        go.set()
    (builder,) = opened
    await builder.close()
    later = await cache.open("k", "local", SPEC, OPTIONS, slow, uses=2)
    async with later:
        assert later.origin is not None, "the cancelled waiter neither built nor held"
    await cache.aclose()


@pytest.mark.anyio
async def test_a_failed_build_sets_each_sample_up(local_root: Path) -> None:
    async def refuse(self: LocalSandbox) -> str:
        from sandlot.errors import SandboxError

        raise SandboxError("cannot freeze", retryable=False)

    (cache,) = caches(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalSandbox, "_snapshot", refuse)
        opened = [await cache.open("k", "local", SPEC, OPTIONS, ready) for _ in range(2)]
    assert cache.set_ups == 2 and all(sb.origin is None for sb in opened)
    for sb in opened:
        await sb.close()
    await cache.aclose()


class Sampler:
    """A Ray actor (its own process) opening samples through a shared ``SetupCache``."""

    def __init__(self, root: str, run: str, lease_s: float) -> None:
        os.environ["SANDLOT_LOCAL_ROOT"] = root
        # no wait deadline in effect: a waiter falls back only through the builder's lease
        self.cache = SetupCache(shared=SharedSetups(run, lease_s=lease_s, wait_s=3600))
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
        return self.cache.set_ups


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


@pytest.mark.anyio
async def test_a_failing_set_up_raises_its_own_error_and_its_waiters_set_up(
    local_root: Path,
) -> None:
    class Broken(Exception):
        pass

    async def broken(sb: Any) -> None:
        raise Broken("the repository cannot be checked out")

    (cache,) = caches(1)
    with pytest.raises(Broken):
        await cache.open("k", "local", SPEC, OPTIONS, broken)
    async with await cache.open("k", "local", SPEC, OPTIONS, ready) as alone:
        assert alone.origin is None
    assert cache.set_ups == 2
    await cache.aclose()


@pytest.mark.anyio
async def test_a_builder_cancelled_mid_build_lets_its_waiters_set_up(local_root: Path) -> None:
    building = anyio.Event()

    async def hang(sb: Any) -> None:
        building.set()
        await anyio.sleep_forever()

    one, two = caches(2)
    async with anyio.create_task_group() as tg:
        builder = anyio.CancelScope()

        async def build() -> None:
            with builder:
                await one.open("k", "local", SPEC, OPTIONS, hang)

        async def wait() -> None:
            waited.append(await two.open("k", "local", SPEC, OPTIONS, ready))

        waited: list[Any] = []
        tg.start_soon(build)
        await building.wait()
        tg.start_soon(wait)  # it polls while the build hangs
        await anyio.sleep(0.2)
        builder.cancel()  # the build publishes nothing: the waiter sets up alone
    (alone,) = waited
    async with alone:
        assert alone.origin is None and b"ready" in await alone.read_file("ready.txt")
    assert (one.set_ups, two.set_ups) == (1, 1)
    await one.aclose()


@pytest.mark.anyio
async def test_a_build_cancelled_while_freezing_closes_its_sandbox(
    local_root: Path, freezing_hangs: anyio.Event
) -> None:
    (cache,) = caches(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(cache.open, "k", "local", SPEC, OPTIONS, ready)
        await freezing_hangs.wait()
        tg.cancel_scope.cancel()
    await cache.aclose()
    # local_root checks at teardown that the set-up sandbox was closed
