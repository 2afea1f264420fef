"""The samples of a row share one set-up for their agents and one for their gradings
(``SetupCache``, ``sandlot rollout -n``); the cache itself is tested in
``tests/sandboxes/setups/``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import anyio
import pytest
from requirements import EVAL, TEST, bwrap_missing, need_module, needs
from rollout.scripted_server import ScriptedServer

from sandlot.datasets.rows import TaskRow
from sandlot.errors import SandboxError
from sandlot.rollout import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.trajectory import EpisodeSetups, ExitReason, Trajectory
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.setups.counts import SetupCounts

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
        traj = await run_episode(row, policy, CONFIG, sample=sample, setups=setups, group_size=4)
        trajectories.append(traj)

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
    for traj in trajectories:
        assert traj.exit_reason is ExitReason.SUBMITTED and traj.reward == 1.0, traj.error
    total = sum((t.setups for t in trajectories), EpisodeSetups())
    # the agents: one set-up, three forks; the gradings: one clean set-up, four forks of it
    assert total == EpisodeSetups(
        agent=SetupCounts(set_up=1, forked=3), grading=SetupCounts(set_up=1, forked=4)
    )
    assert setups.counts == SetupCounts(set_up=2, forked=7)
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
    assert setups.counts == SetupCounts(set_up=8, forked=0)
    assert all(t.reward == 1.0 for t in trajectories)
