"""``SetupCache`` on ``local``: one set-up per key, forks of it, the snapshot deleted when its
group opened or it was evicted and its forks closed, every failure a per-sample set-up; in
this process's table and on a registry shared with other caches (its actor run here)."""

from __future__ import annotations

import os
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest
from setups_helpers import OPTIONS, SPEC, caches, ready

from sandlot.errors import SandboxError
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.setups.counts import SetupCounts

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("local_root")]


async def test_at_most_max_snapshots_are_kept() -> None:
    async with aclosing(SetupCache(max_snapshots=1)) as setups:
        for key in ("a", "b", "a"):
            sb = await setups.open(key, "local", SPEC, OPTIONS, ready)
            await sb.close()
        assert setups.counts.set_up == 3  # "a" was evicted by "b", so set up again
        forked = await setups.open("a", "local", SPEC, OPTIONS, ready)
        async with forked:
            assert forked.origin is not None and (await forked.read_file("ready.txt"))
        assert setups.counts == SetupCounts(set_up=3, forked=1)


async def test_a_group_snapshot_is_deleted_once_its_last_sample_opened_and_forks_closed() -> None:
    async with aclosing(SetupCache()) as setups:
        group = [
            await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=3) for _ in range(3)
        ]
        assert [sb.origin is not None for sb in group] == [False, True, True]
        snapshot = group[1].origin
        assert snapshot is not None and snapshot.handle is not None
        for sb in group:
            assert await anyio.Path(snapshot.handle).is_dir(), "a fork still runs"
            await sb.close()
        assert not await anyio.Path(snapshot.handle).exists(), "before the cache's close"
        alone = [
            await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=1) for _ in range(2)
        ]
        for sb in alone:
            assert sb.origin is None  # a group of one is set up without a snapshot
            await sb.close()
        assert setups.counts == SetupCounts(set_up=3, forked=2)


async def test_with_fork_first_every_sample_forks_the_clean_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gradings: the set-up sandbox is closed, all samples are forks. Its close is slowed
    down so a sibling's fork starts first (that once deleted the snapshot under the first
    sample, which then set up again)."""
    close = LocalSandbox.close

    async def slow_close(self: LocalSandbox) -> None:
        if self.origin is None:
            await anyio.sleep(1)
        await close(self)

    monkeypatch.setattr(LocalSandbox, "close", slow_close)
    opened: list[Any] = []

    async def one(setups: SetupCache) -> None:
        sb = await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=2, fork_first=True)
        opened.append(sb)

    async with aclosing(SetupCache()) as setups:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, setups)
            tg.start_soon(one, setups)
        for sb in opened:
            async with sb:
                assert sb.origin is not None and b"ready" in await sb.read_file("ready.txt")
        assert setups.counts == SetupCounts(set_up=1, forked=2)


async def test_a_set_up_sandbox_is_closed_when_freezing_it_is_cancelled(
    freezing_hangs: anyio.Event,
) -> None:
    async with aclosing(SetupCache()) as setups, anyio.create_task_group() as tg:
        tg.start_soon(setups.open, "a", "local", SPEC, OPTIONS, ready)
        await freezing_hangs.wait()
        tg.cancel_scope.cancel()
    # local_root checks at teardown that the set-up sandbox was closed


async def test_a_group_whose_samples_wait_for_the_set_up_deletes_its_snapshot() -> None:
    """The samples of a group arrive while the first sets up (verl starts them at once): the
    key is dropped once the last of them opened."""
    opened: list[Any] = []

    async def one(setups: SetupCache) -> None:
        opened.append(await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=3))

    async with aclosing(SetupCache()) as setups:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one, setups)
        assert sorted(sb.origin is not None for sb in opened) == [False, True, True]
        for sb in opened:
            await sb.close()
        handle = next(sb.origin.handle for sb in opened if sb.origin is not None)
        assert not await anyio.Path(handle).exists(), "before the cache's close"


@pytest.fixture
def forks_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fork of a ``local`` snapshot fails to start."""
    start = LocalSandbox._start

    async def refuse_forks(self: LocalSandbox, *args: Any, **kwargs: Any) -> None:
        if self.origin is not None:
            raise SandboxError("the fork's overlay cannot be mounted", retryable=False)
        await start(self, *args, **kwargs)

    monkeypatch.setattr(LocalSandbox, "_start", refuse_forks)


@pytest.mark.usefixtures("forks_fail")
async def test_a_fork_that_fails_to_start_sets_its_sample_up() -> None:
    async with aclosing(SetupCache()) as setups:
        group = [
            await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=2) for _ in range(2)
        ]
        for sb in group:
            async with sb:
                assert sb.origin is None and b"ready" in await sb.read_file("ready.txt")
        assert setups.counts == SetupCounts(set_up=2, forked=0)


@pytest.mark.usefixtures("forks_fail")
async def test_a_fork_first_sample_whose_fork_fails_sets_itself_up() -> None:
    async with aclosing(SetupCache()) as setups:
        sb = await setups.open("a", "local", SPEC, OPTIONS, ready, group_size=2, fork_first=True)
        async with sb:
            assert sb.origin is None and b"ready" in await sb.read_file("ready.txt")
        assert setups.counts == SetupCounts(set_up=2, forked=0)


async def test_caches_on_one_registry_set_up_once_and_the_last_detach_deletes(
    local_root: Path,
) -> None:
    one, two = await caches(2)
    opened: list[Any] = []

    async def sample(cache: SetupCache) -> None:
        opened.append(await cache.open("k", "local", SPEC, OPTIONS, ready))

    async with anyio.create_task_group() as tg:
        for cache in (one, two, one, two):
            tg.start_soon(sample, cache)
    assert one.counts.set_up + two.counts.set_up == 1
    assert sorted(sb.origin is not None for sb in opened) == [False, True, True, True]
    for sb in opened:
        async with sb:
            assert b"ready" in await sb.read_file("ready.txt")
    assert await anyio.to_thread.run_sync(os.listdir, local_root), "kept for later samples"
    await one.aclose()


async def test_eviction_waits_for_the_forks_of_every_cache() -> None:
    one, two = await caches(2, max_snapshots=1)
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


async def test_a_sample_cancelled_while_waiting_holds_nothing() -> None:
    building = anyio.Event()
    go = anyio.Event()

    async def slow(sb: Any) -> None:
        building.set()
        await go.wait()
        await ready(sb)

    (cache,) = await caches(1)
    opened: list[Any] = []

    async def sample() -> None:
        opened.append(await cache.open("k", "local", SPEC, OPTIONS, slow, group_size=2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        await building.wait()
        with anyio.move_on_after(0.2):
            await cache.open("k", "local", SPEC, OPTIONS, slow, group_size=2)  # cancelled
        go.set()
    (builder,) = opened
    await builder.close()
    later = await cache.open("k", "local", SPEC, OPTIONS, slow, group_size=2)
    async with later:
        assert later.origin is not None, "the cancelled waiter neither built nor held"
    await cache.aclose()


async def test_a_failed_build_sets_each_sample_up(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(self: LocalSandbox) -> str:
        raise SandboxError("cannot freeze", retryable=False)

    monkeypatch.setattr(LocalSandbox, "_snapshot", refuse)
    (cache,) = await caches(1)
    opened = [await cache.open("k", "local", SPEC, OPTIONS, ready) for _ in range(2)]
    assert cache.counts.set_up == 2 and all(sb.origin is None for sb in opened)
    for sb in opened:
        await sb.close()
    await cache.aclose()


async def test_a_failing_set_up_raises_its_own_error_and_its_waiters_set_up() -> None:
    class Broken(Exception):
        pass

    async def broken(sb: Any) -> None:
        raise Broken("the repository cannot be checked out")

    (cache,) = await caches(1)
    with pytest.raises(Broken):
        await cache.open("k", "local", SPEC, OPTIONS, broken)
    async with await cache.open("k", "local", SPEC, OPTIONS, ready) as alone:
        assert alone.origin is None
    assert cache.counts.set_up == 2
    await cache.aclose()


async def test_a_builder_cancelled_mid_build_lets_its_waiters_set_up() -> None:
    building = anyio.Event()

    async def hang(sb: Any) -> None:
        building.set()
        await anyio.sleep_forever()

    one, two = await caches(2)
    waited: list[Any] = []
    async with anyio.create_task_group() as tg:
        builder = anyio.CancelScope()

        async def build() -> None:
            with builder:
                await one.open("k", "local", SPEC, OPTIONS, hang)

        async def wait() -> None:
            waited.append(await two.open("k", "local", SPEC, OPTIONS, ready))

        tg.start_soon(build)
        await building.wait()
        tg.start_soon(wait)  # it waits while the build hangs
        await anyio.sleep(0.2)
        builder.cancel()  # the build publishes nothing: the waiter sets up alone
    (alone,) = waited
    async with alone:
        assert alone.origin is None and b"ready" in await alone.read_file("ready.txt")
    assert (one.counts.set_up, two.counts.set_up) == (1, 1)
    await one.aclose()


async def test_a_build_cancelled_while_freezing_closes_its_sandbox(
    freezing_hangs: anyio.Event,
) -> None:
    (cache,) = await caches(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(cache.open, "k", "local", SPEC, OPTIONS, ready)
        await freezing_hangs.wait()
        tg.cancel_scope.cancel()
    await cache.aclose()
    # local_root checks at teardown that the set-up sandbox was closed


async def test_release_evicts_an_instances_set_ups_at_once() -> None:
    """No group size (verl's validation prompts): the batch's end releases the snapshot."""
    async with aclosing(SetupCache()) as setups:
        sb = await setups.open("i/local/abc", "local", SPEC, OPTIONS, ready)
        other = await setups.open("j/local/abc", "local", SPEC, OPTIONS, ready)
        fork = await setups.open("i/local/abc", "local", SPEC, OPTIONS, ready)
        assert fork.origin is not None and fork.origin.handle is not None
        await setups.release("i", "local")
        assert await anyio.Path(fork.origin.handle).is_dir(), "its fork still runs"
        for opened in (sb, fork, other):
            await opened.close()
        assert not await anyio.Path(fork.origin.handle).exists(), "before the cache's close"
        again = await setups.open("i/local/abc", "local", SPEC, OPTIONS, ready)
        assert again.origin is None, "released: set up anew"
        await again.close()
        kept = await setups.open("j/local/abc", "local", SPEC, OPTIONS, ready)
        assert kept.origin is not None, "another instance's set-up stays"
        await kept.close()
