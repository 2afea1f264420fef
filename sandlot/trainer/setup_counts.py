"""Each training step's sandbox set-ups, counted where the trainer logs them.

The samples run in verl's agent-loop workers; the step's metrics are logged by the trainer
process (:mod:`sandlot.trainer.advantage`, whose estimator verl calls once a step and which sees
only tensors). Each sample's :class:`~sandlot.rollout.trajectory.EpisodeSetups` is added to one
tally per run: a named Ray actor (``sandlot-setup-counts-<run id>``, namespace ``sandlot``)
under Ray, else this process's. The trainer takes what was added since the last step at each
advantage call (:func:`take`). With the fully async trainer the rollouter runs ahead of the
trainer: a step's counts are then those of the samples finished since the previous step, not
exactly the samples of its batch.

Written against Ray 2.x (named actors, ``get_if_exists``); Ray is imported only under Ray.
"""

from __future__ import annotations

import logging
from typing import Any

from sandlot.rollout.trajectory import EpisodeSetups
from sandlot.sandboxes.labels import run_id
from sandlot.sandboxes.scale.starting import ray_is_running

log = logging.getLogger("sandlot.trainer")
NAMESPACE = "sandlot"


class Tally:
    """The counts added since the last :meth:`take` (the Ray actor's class, or this
    process's tally)."""

    def __init__(self) -> None:
        self._counts = EpisodeSetups()

    def add(self, setups: EpisodeSetups) -> None:
        self._counts += setups

    def take(self) -> EpisodeSetups:
        counts, self._counts = self._counts, EpisodeSetups()
        return counts


_local = Tally()
_actor: Any = None


def _name() -> str:
    return f"sandlot-setup-counts-{run_id()}"


def _remote() -> Any:
    """The run's tally actor (created by the first worker that adds)."""
    global _actor
    if _actor is None:
        import ray

        _actor = (
            ray.remote(num_cpus=0)(Tally)
            .options(name=_name(), namespace=NAMESPACE, get_if_exists=True)
            .remote()
        )
    return _actor


async def add(setups: EpisodeSetups) -> None:
    """Add one sample's set-ups to the run's tally (a failure is logged: counts only)."""
    if not ray_is_running():
        _local.add(setups)
        return
    try:
        await _remote().add.remote(setups)
    except Exception as exc:  # a Ray error: the counts of this sample are lost, nothing else
        log.warning("cannot count the sample's set-ups (%s)", exc)


def take() -> EpisodeSetups:
    """What was added since the last call (in the trainer process, once a step)."""
    if not ray_is_running():
        return _local.take()
    import ray

    try:
        actor = ray.get_actor(_name(), namespace=NAMESPACE)
    except ValueError:  # no sample counted yet
        return EpisodeSetups()
    counts: EpisodeSetups = ray.get(actor.take.remote())
    return counts


def as_metrics(setups: EpisodeSetups) -> dict[str, float]:
    """The counts under ``sandlot/setups/...`` metric names."""
    return {
        f"sandlot/setups/{purpose}/{what}": float(getattr(counts, what))
        for purpose, counts in (("agent", setups.agent), ("grading", setups.grading))
        for what in ("set_up", "forked")
    }
