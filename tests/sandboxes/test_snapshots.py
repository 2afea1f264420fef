"""Snapshots beyond the contract: the checks of ``sandlot.open(snapshot=)``, the deferred
removal, and ``sandlot gc`` of snapshots (local, docker); ``open_group`` is tested with the
set-ups (``tests/sandboxes/setups/``)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from requirements import TEST_IMAGE, bwrap_missing, docker_engine_missing, missing

import sandlot
from sandlot.sandboxes.labels import RUN_ID, run_id
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.local.reaper import LocalReaper

pytestmark = pytest.mark.anyio

TOKEN = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > token.txt"


@pytest.fixture
def local_root(tmp_path: Path) -> str:
    if reason := bwrap_missing():
        missing(reason)
    return str(tmp_path / "sandboxes")


async def test_a_fork_keeps_its_snapshots_backend_and_set_up(local_root: str) -> None:
    async with sandlot.open("local", post_setup_cmd="true", root_dir=local_root) as sb:
        snap = await sb.snapshot()
    try:
        with pytest.raises(ValueError, match="post_setup_cmd differ"):
            sandlot.open(snapshot=snap, post_setup_cmd="echo other")
        with pytest.raises(ValueError, match="cannot start a docker sandbox"):
            sandlot.open("docker", snapshot=snap)
        fork = sandlot.open(snapshot=snap, env={"A": "1"})  # what is not set-up may change
        assert fork.origin is snap and fork.spec.env == {"A": "1"}
        with pytest.raises(ValueError, match="at least one"):
            async with sandlot.open_group(n=0):
                pass
    finally:
        await snap.delete()


async def test_the_snapshot_is_removed_when_its_last_fork_closes(local_root: str) -> None:
    async with sandlot.open("local", post_setup_cmd=TOKEN, root_dir=local_root) as sb:
        snap = await sb.snapshot()
    assert snap.handle is not None
    frozen = Path(snap.handle)
    assert (frozen / "work" / "token.txt").is_file()
    first, second = sandlot.open(snapshot=snap), sandlot.open(snapshot=snap)
    async with first:
        async with second:
            await snap.delete()
        assert await anyio.Path(frozen).is_dir()  # `first` still runs
    assert not await anyio.Path(frozen).exists()


async def test_gc_removes_the_snapshots_a_run_left(local_root: str) -> None:
    async with sandlot.open("local", post_setup_cmd=TOKEN, root_dir=local_root) as sb:
        snap = await sb.snapshot()
    assert snap.handle is not None
    reaper = LocalReaper(local_root)
    found = await reaper.list_sandboxes(run_id())
    assert [s.id for s in found] == [Path(snap.handle).name]
    assert found[0].labels[RUN_ID] == run_id()
    await reaper.kill(found[0])
    assert not await anyio.Path(snap.handle).exists()
    await snap.delete()  # gone already: logged, not raised


async def test_docker_snapshots_are_labelled_images_that_gc_and_delete_remove() -> None:
    if reason := docker_engine_missing():
        missing(reason)
    from sandlot.sandboxes.reaper import get_reaper

    async with sandlot.open("docker", image=TEST_IMAGE, pull="never", post_setup_cmd=TOKEN) as sb:
        snap = await sb.snapshot()
        kept = await sb.snapshot()
    assert snap.handle is not None and kept.handle is not None
    reaper = get_reaper("docker")
    try:
        found = {s.id: s for s in await reaper.list_sandboxes(run_id())}
        assert {snap.handle, kept.handle} <= found.keys()
        assert found[snap.handle].state == "snapshot"
        async with sandlot.open(snapshot=snap) as fork:
            await snap.delete()
            assert snap.handle in {s.id for s in await reaper.list_sandboxes(run_id())}
            assert (await fork.exec("cat token.txt")).ok
        await reaper.kill(found[kept.handle])
        left = {s.id for s in await reaper.list_sandboxes(run_id())}
        assert snap.handle not in left and kept.handle not in left
    finally:
        await snap.delete()
        await kept.delete()


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_a_jailed_fork_of_the_host_stacks_the_snapshots_workdir(
    local_root: str, zygote: bool
) -> None:
    setup = f"{TOKEN} && echo kept > kept.txt"
    opened = sandlot.open("local", post_setup_cmd=setup, root_dir=local_root, zygote=zygote)
    async with opened as sb:
        snap = await sb.snapshot()
    try:
        async with sandlot.open(snapshot=snap) as fork:
            assert isinstance(fork, LocalSandbox) and fork.host_dir and fork.host_workdir
            r = await fork.exec("rm token.txt && echo new > new.txt && ls")
            assert r.stdout.split() == ["kept.txt", "new.txt"], r.stderr
            # nothing copied: the fork's writes (and the whiteout of token.txt) are its layer
            upper = await anyio.to_thread.run_sync(os.listdir, fork.host_dir / "upper")
            assert sorted(upper) == ["new.txt", "token.txt"]
            assert await anyio.to_thread.run_sync(os.listdir, fork.host_workdir) == []
    finally:
        await snap.delete()
