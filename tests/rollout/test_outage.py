"""A model server that goes down for 90 s in the middle of a batch: the episodes in flight wait
for their own turn to be retried (the client's time budget) and finish; none is rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from requirements import EVAL, TEST, bwrap_missing, need_module, needs
from rollout.conftest import MakeRow
from rollout.scripted_server import ScriptedServer
from rollout.virtual_time import VirtualClock

from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.episodes import InProcessEpisodes
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.scheduler import run_rollout
from sandlot.rollout.stats import RolloutStats
from sandlot.rollout.store import TrajectoryLog, iter_trajectories
from sandlot.rollout.trajectory import ExitReason

need_module("swebench", EVAL)
need_module("httpx", TEST)
pytestmark = [pytest.mark.anyio, needs(bwrap_missing), pytest.mark.usefixtures("local_root")]

OUTAGE_S = 90.0
DOWN_AFTER_REQUESTS = 6
IDS = ["minicalc__minicalc-1", "textkit__textkit-1", "ledger__ledger-1", "ledger__ledger-2"]


@pytest.mark.slow
async def test_a_90_s_outage_mid_batch_loses_no_episode(
    make_row: MakeRow, server: ScriptedServer, tmp_path: Path
) -> None:
    """The server stops listening (connections refused, open ones dropped) after a few turns of
    four concurrent episodes and comes back 90 virtual seconds later. The client's default
    retry budget (300 s) outlasts it: every episode is submitted and resolved on its first
    attempt (the scheduler reran nothing). A count of 5 retries (about 23 s of backoff), as
    the client had, gives up inside the outage and the scheduler reruns the episode."""
    clock = VirtualClock()
    config = parse_agent_config(
        {
            "sandbox": {"backend": "local", "options": {"local": {"isolation": "bwrap"}}},
            "interaction": {"max_turns": 10},
            "reward": {"mode": "same"},
        }
    )
    outage: dict[str, Any] = {}

    async def take_the_server_down() -> None:
        with anyio.fail_after(300):  # only if the episodes never reach the trigger
            # The count is kept by the server's threads: polled, no event to wait on.
            while sum(server.requests.values()) < DOWN_AFTER_REQUESTS:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        server.go_down()
        outage["down_at"] = clock.now
        outage["requests_before"] = sum(server.requests.values())
        clock.at(clock.now + OUTAGE_S, server.come_up)

    stats = RolloutStats()
    policy = OpenAIChatPolicy(server.url, "solver", clock=clock, sleep=clock.sleep)
    path = tmp_path / "trajectories.jsonl"
    async with policy:
        with TrajectoryLog(path) as log, InProcessEpisodes(policy, config, backend="local") as eps:
            async with anyio.create_task_group() as tg:
                tg.start_soon(take_the_server_down)
                await run_rollout([make_row(i) for i in IDS], eps, log, concurrency=4, stats=stats)
    records = list(iter_trajectories(path, latest=False))  # a rerun would add a line
    assert sorted(t.instance_id for t in records) == sorted(IDS)
    for traj in records:
        assert traj.exit_reason is ExitReason.SUBMITTED, (traj.instance_id, traj.error)
        assert traj.reward == 1.0
        assert traj.attempts == 1, traj.instance_id  # never rerun from scratch
    assert stats.retries == 0
    # The outage happened mid-batch and lasted its 90 s: turns were answered before it and
    # after it, and the clients' waits spanned it.
    assert outage["requests_before"] >= DOWN_AFTER_REQUESTS
    assert sum(server.requests.values()) > outage["requests_before"]
    assert clock.now >= outage["down_at"] + OUTAGE_S
    assert not server.down
