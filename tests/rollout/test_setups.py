"""The samples of a row share one set-up (``SetupCache``, ``sandlot rollout -n``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anyio
import pytest
from requirements import EVAL, TEST, bwrap_missing, need_module, needs
from rollout.scripted_server import ScriptedServer

from sandlot.datasets.rows import TaskRow
from sandlot.errors import SandboxError
from sandlot.rollout import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.trajectory import ExitReason, Trajectory
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.spec import SandboxSpec

need_module("swebench", EVAL)
need_module("httpx", TEST)
pytestmark = [pytest.mark.anyio, needs(bwrap_missing), pytest.mark.usefixtures("local_root")]

MakeRow = Callable[..., TaskRow]
CONFIG = parse_agent_config(
    {
        "sandbox": {"backend": "local", "options": {"local": {"isolation": "bwrap"}}},
        "interaction": {"max_turns": 10},
        "reward": {"mode": "fresh"},
    }
)


@pytest.fixture
async def solver(server: ScriptedServer) -> AsyncIterator[OpenAIChatPolicy]:
    client = OpenAIChatPolicy(server.url, "solver", backoff_s=0.01, api_key="sk-x")
    yield client
    await client.aclose()


async def _group(
    make_row: MakeRow, policy: OpenAIChatPolicy, setups: SetupCache
) -> list[Trajectory]:
    row = make_row("minicalc__minicalc-1")
    trajectories: list[Trajectory] = []

    async def one(sample: int) -> None:
        trajectories.append(await run_episode(row, policy, CONFIG, sample=sample, setups=setups))

    async with anyio.create_task_group() as tg:
        for sample in range(4):
            tg.start_soon(one, sample)
    return trajectories


@pytest.mark.slow
async def test_the_samples_of_a_row_are_set_up_once(
    make_row: MakeRow, solver: OpenAIChatPolicy
) -> None:
    async with aclosing(SetupCache()) as setups:
        trajectories = await _group(make_row, solver, setups)
    assert setups.set_ups == 1
    for traj in trajectories:
        assert traj.exit_reason is ExitReason.SUBMITTED and traj.reward == 1.0, traj.error
    # local_root checks at teardown that the snapshot was deleted with every sandbox


@pytest.mark.slow
async def test_a_set_up_that_cannot_be_frozen_is_done_per_sample(
    make_row: MakeRow, solver: OpenAIChatPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(self: LocalSandbox) -> str:
        raise SandboxError("cannot freeze", retryable=False)

    monkeypatch.setattr(LocalSandbox, "_snapshot", refuse)
    async with aclosing(SetupCache()) as setups:
        trajectories = await _group(make_row, solver, setups)
    assert setups.set_ups == 4
    assert all(t.reward == 1.0 for t in trajectories)


async def test_at_most_max_snapshots_are_kept() -> None:
    async def prepare(sb: Any) -> None:
        await sb.exec("echo ready > ready.txt")

    spec, options = SandboxSpec(), LocalSandbox.Options()
    async with aclosing(SetupCache(max_snapshots=1)) as setups:
        for key in ("a", "b", "a"):
            sb = await setups.open(key, "local", spec, options, prepare)
            await sb.close()
        assert setups.set_ups == 3  # "a" was evicted by "b", so set up again
        forked = await setups.open("a", "local", spec, options, prepare)
        async with forked:
            assert forked.origin is not None and (await forked.read_file("ready.txt"))
        assert setups.set_ups == 3


async def test_a_group_snapshot_is_deleted_once_its_last_sample_opened() -> None:
    async def prepare(sb: Any) -> None:
        await sb.exec("echo ready > ready.txt")

    spec, options = SandboxSpec(), LocalSandbox.Options()
    async with aclosing(SetupCache()) as setups:
        group = [await setups.open("a", "local", spec, options, prepare, uses=3) for _ in range(3)]
        assert [sb.origin is not None for sb in group] == [False, True, True]
        snapshot = group[1].origin
        assert snapshot is not None and snapshot.deleted  # removed as its forks close
        for sb in group:
            await sb.close()
        alone = [await setups.open("a", "local", spec, options, prepare, uses=1) for _ in range(2)]
        for sb in alone:
            assert sb.origin is None  # a group of one is set up without a snapshot
            await sb.close()
        assert setups.set_ups == 3
    # local_root checks at teardown that the snapshot directory is gone


async def test_with_fork_first_every_sample_forks_the_clean_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Graded evaluations: the set-up sandbox is closed, all samples are forks. Its close is
    slowed down so a sibling's fork starts first (that once deleted the snapshot under the
    first sample, which then set up again)."""
    close = LocalSandbox.close

    async def slow_close(self: LocalSandbox) -> None:
        if self.origin is None:
            await anyio.sleep(1)
        await close(self)

    monkeypatch.setattr(LocalSandbox, "close", slow_close)

    async def prepare(sb: Any) -> None:
        await sb.exec("echo ready > ready.txt")

    spec, options = SandboxSpec(), LocalSandbox.Options()
    opened: list[Any] = []

    async def one(setups: SetupCache) -> None:
        opened.append(await setups.open("a", "local", spec, options, prepare, uses=2))

    async with aclosing(SetupCache(fork_first=True)) as setups:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, setups)
            tg.start_soon(one, setups)
        for sb in opened:
            async with sb:
                assert sb.origin is not None and b"ready" in await sb.read_file("ready.txt")
        assert setups.set_ups == 1


async def test_a_set_up_sandbox_is_closed_when_freezing_it_is_cancelled(
    freezing_hangs: anyio.Event,
) -> None:
    async def prepare(sb: Any) -> None:
        await sb.exec("true")

    async with aclosing(SetupCache()) as setups, anyio.create_task_group() as tg:
        tg.start_soon(setups.open, "a", "local", SandboxSpec(), LocalSandbox.Options(), prepare)
        await freezing_hangs.wait()
        tg.cancel_scope.cancel()
    # local_root checks at teardown that the set-up sandbox was closed


async def test_a_group_whose_samples_wait_for_the_set_up_deletes_its_snapshot() -> None:
    """The samples of a group arrive while the first sets up (verl starts them at once): the
    snapshot is deleted once the last of them opened (the first's return once reset the count
    of the waiting ones, and the snapshot outlived the run)."""

    async def prepare(sb: Any) -> None:
        await sb.exec("echo ready > ready.txt")

    spec, options = SandboxSpec(), LocalSandbox.Options()
    opened: list[Any] = []

    async def one(setups: SetupCache) -> None:
        opened.append(await setups.open("a", "local", spec, options, prepare, uses=3))

    async with aclosing(SetupCache()) as setups:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one, setups)
        assert sorted(sb.origin is not None for sb in opened) == [False, True, True]
        snapshot = next(sb.origin for sb in opened if sb.origin is not None)
        assert snapshot.deleted  # before aclose: the group's last sample dropped it
        for sb in opened:
            await sb.close()


async def test_a_fork_that_fails_to_start_sets_its_sample_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = LocalSandbox._start

    async def refuse_forks(self: LocalSandbox, *args: Any, **kwargs: Any) -> None:
        if self.origin is not None:
            raise SandboxError("the fork's overlay cannot be mounted", retryable=False)
        await start(self, *args, **kwargs)

    monkeypatch.setattr(LocalSandbox, "_start", refuse_forks)

    async def prepare(sb: Any) -> None:
        await sb.exec("echo ready > ready.txt")

    spec, options = SandboxSpec(), LocalSandbox.Options()
    async with aclosing(SetupCache()) as setups:
        group = [await setups.open("a", "local", spec, options, prepare, uses=2) for _ in range(2)]
        for sb in group:
            async with sb:
                assert sb.origin is None and b"ready" in await sb.read_file("ready.txt")
        assert (setups.set_ups, setups.fork_failures) == (2, 1)
