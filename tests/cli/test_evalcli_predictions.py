"""``predictions.jsonl`` of a rollout holds what the model submitted: an instance whose first
sample ended in ``infra_error`` is left out (the SWE-bench harness counts every line as a
submission), and stays out when a later sample of it ran."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from sandlot.rollout.store import TrajectoryLog, write_predictions
from sandlot.rollout.trajectory import ExitReason, Trajectory


def test_infra_failed_first_samples_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"

    async def record() -> None:
        with TrajectoryLog(path) as log:
            for iid, sample, reason, patch in [
                ("a", 0, ExitReason.INFRA_ERROR, ""),
                ("a", 1, ExitReason.SUBMITTED, "a1"),
                ("b", 0, ExitReason.SUBMITTED, "b0"),
                ("c", 0, ExitReason.MAX_TURNS, ""),
            ]:
                traj = Trajectory(
                    instance_id=iid, sample=sample, exit_reason=reason, model_patch=patch
                )
                await log.append(traj)
            count = write_predictions(
                log.records,
                path,
                tmp_path / "p.jsonl",
                order=["a", "b", "c"],
                model_name_or_path="m",
            )
            assert count == 2

    anyio.run(record)
    preds = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    # c ran out of turns: the model's own (empty) submission, counted; a is not the model's
    assert [(p["instance_id"], p["model_patch"]) for p in preds] == [("b", "b0"), ("c", "")]
