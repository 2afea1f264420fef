"""The agent-loop worker's ``SetupCache``: one per event loop, emptied at the process's exit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from requirements import TRAIN, bwrap_missing, need_module, needs

need_module("verl.experimental.agent_loop", TRAIN)

from sandlot.sandboxes.local import LocalSandbox  # noqa: E402
from sandlot.sandboxes.setups.cache import SetupCache  # noqa: E402
from sandlot.sandboxes.spec import SandboxSpec  # noqa: E402
from sandlot.trainer import agent_loop  # noqa: E402


@needs(bwrap_missing)
def test_the_exit_hook_deletes_what_the_worker_caches_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(tmp_path))
    monkeypatch.setattr(agent_loop, "_setups", type(agent_loop._setups)())
    hooks: list[object] = []
    monkeypatch.setattr(agent_loop.atexit, "register", hooks.append)

    async def prepare(sb: LocalSandbox) -> None:
        await sb.exec("echo ready > ready.txt")

    async def worker() -> None:
        cache = agent_loop.worker_setups()
        assert agent_loop.worker_setups() is cache  # one per loop
        spec, options = SandboxSpec(), LocalSandbox.Options()
        sb = await cache.open("a", "local", spec, options, prepare)  # no uses: kept
        await sb.close()
        assert cache.counts.set_up == 1

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(worker())
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("sandlot-snap-")]
        assert hooks == [agent_loop._delete_snapshots]  # registered once, at the first cache
        agent_loop._delete_snapshots()  # as atexit runs it, outside the worker's loop
    finally:
        loop.close()
    assert not list(tmp_path.iterdir()), "the snapshot outlived the worker"


@needs(bwrap_missing)
def test_an_instances_set_ups_are_released_when_its_last_sample_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation prompts (no group size): the set-up goes when the batch's last sample of
    the instance ends, not when evicted."""
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(tmp_path))

    async def prepare(sb: LocalSandbox) -> None:
        await sb.exec("echo ready > ready.txt")

    async def batch() -> None:
        cache = SetupCache()
        spec, options = SandboxSpec(), LocalSandbox.Options()
        first = agent_loop._in_batch(cache, "i", "local")
        second = agent_loop._in_batch(cache, "i", "local")
        async with first:
            async with await cache.open("i/local/x", "local", spec, options, prepare):
                pass
            async with second:
                fork = await cache.open("i/local/x", "local", spec, options, prepare)
                assert fork.origin is not None and fork.origin.handle is not None
                await fork.close()
            assert (tmp_path / fork.origin.handle).is_dir(), "a sample of it still runs"
        assert not (tmp_path / fork.origin.handle).exists(), "released with the last one"
        await cache.aclose()

    asyncio.run(batch())
