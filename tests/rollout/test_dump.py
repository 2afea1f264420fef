"""Training's trajectory files (``sandlot.rollout.dump``): one per process, every append on
disk and read back, repeated episodes of one instance kept apart."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anyio

from sandlot.rollout.dump import DUMP_GLOB, TrajectoryDump
from sandlot.rollout.store import iter_trajectories
from sandlot.rollout.trajectory import ExitReason, Trajectory


def test_each_process_appends_to_its_own_file(tmp_path: Path) -> None:
    dump = TrajectoryDump(tmp_path / "kept")
    episodes = [
        Trajectory(instance_id="a__a-1", exit_reason=ExitReason.SUBMITTED, reward=r)
        for r in (0.0, 1.0, 0.0)
    ]

    async def append_all() -> None:
        async with anyio.create_task_group() as tg:
            for traj in episodes:
                tg.start_soon(dump.append, traj)

    anyio.run(append_all)
    assert dump.path.name == f"trajectories.{socket.gethostname()}.{os.getpid()}.jsonl"
    assert list((tmp_path / "kept").glob(DUMP_GLOB)) == [dump.path]
    back = list(iter_trajectories(dump.path, latest=False))
    assert sorted(t.reward for t in back) == [0.0, 0.0, 1.0]  # the same episode key, three times
