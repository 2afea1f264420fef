"""The training step's set-up counts: added by the agent-loop workers, taken once a step by
the trainer, in one process and through the run's Ray actor."""

from __future__ import annotations

import anyio
import pytest
from requirements import TRAIN, need_module

from sandlot.rollout.trajectory import EpisodeSetups
from sandlot.sandboxes.setups.counts import SetupCounts
from sandlot.trainer import setup_counts

GROUP = EpisodeSetups(
    agent=SetupCounts(set_up=1, forked=3), grading=SetupCounts(set_up=1, forked=4)
)


def test_a_step_takes_what_was_added_since_the_last() -> None:
    setup_counts.take()  # whatever an earlier test left
    for _ in range(2):
        anyio.run(setup_counts.add, GROUP)
    taken = setup_counts.take()
    assert taken == GROUP + GROUP
    assert setup_counts.as_metrics(taken) == {
        "sandlot/setups/agent/set_up": 2.0,
        "sandlot/setups/agent/forked": 6.0,
        "sandlot/setups/grading/set_up": 2.0,
        "sandlot/setups/grading/forked": 8.0,
    }
    assert setup_counts.take() == EpisodeSetups(), "taken: the next step starts from 0"


@pytest.mark.slow
def test_workers_add_to_the_runs_actor_and_the_trainer_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = need_module("ray", TRAIN)
    monkeypatch.setenv("SANDLOT_RUN_ID", "counts-test")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        def worker() -> None:
            anyio.run(setup_counts.add, GROUP)

        assert setup_counts.take() == EpisodeSetups(), "no sample counted yet"
        ray.get([worker.remote(), worker.remote()])
        assert setup_counts.take() == GROUP + GROUP
        assert setup_counts.take() == EpisodeSetups()
    finally:
        ray.shutdown()
        setup_counts._actor = None
