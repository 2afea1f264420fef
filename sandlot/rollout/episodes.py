"""What runs one episode for the scheduler: the :class:`Episodes` contract, the
:class:`Gauges` it reports, and :class:`InProcessEpisodes`, which runs episodes on this event
loop (:mod:`sandlot.rollout.ray_episodes` runs them on a Ray cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from sandlot.datasets.rows import TaskRow
from sandlot.rollout.agent import run_episode
from sandlot.rollout.config import AgentConfig
from sandlot.rollout.policy import Policy
from sandlot.rollout.trajectory import ExitReason, Trajectory
from sandlot.sandboxes.base import live_sandboxes
from sandlot.sandboxes.scale.starting import starting_gate
from sandlot.sandboxes.setups.cache import SetupCache


@dataclass(frozen=True)
class Gauges:
    """What is in flight right now: sandboxes in STARTING, and sandboxes open."""

    starting: int = 0
    alive: int = 0


class Episodes(Protocol):
    """What runs one episode for the scheduler (in this process, or on a Ray actor)."""

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        """Run sample ``sample`` of ``row``. Should not raise except on cancellation (a
        raise is recorded as a non-retryable ``infra_error``)."""
        ...

    async def gauges(self) -> Gauges:
        """The current :class:`Gauges` (polled four times a second for the display)."""
        ...


def infra_error_trajectory(row: TaskRow, sample: int, error: str, *, retryable: bool) -> Trajectory:
    """The trajectory of an episode that did not run to an end because of ``error``: what an
    :class:`Episodes` returns, or the scheduler records, instead of raising."""
    return Trajectory(
        instance_id=row.instance.instance_id,
        sample=sample,
        exit_reason=ExitReason.INFRA_ERROR,
        error=error,
        retryable=retryable,
    )


class InProcessEpisodes:
    """Episodes run by :func:`~sandlot.rollout.agent.run_episode` on this event loop, all
    with one ``policy``.

    ``setups`` (a :class:`~sandlot.sandboxes.setups.cache.SetupCache`, which the caller deletes at
    the end of the run) makes the ``group_size`` samples of a row share one set-up for their
    agents and one for their gradings.

    Raises:
        ConfigError: the config's options for ``backend`` are invalid.

    Use as a context manager (``with``): it counts the backend's sandboxes while open.
    """

    def __init__(
        self,
        policy: Policy,
        config: AgentConfig,
        *,
        backend: str,
        model_name_or_path: str = "",
        sandbox_options: BaseModel | None = None,
        setups: SetupCache | None = None,
        group_size: int | None = None,
    ) -> None:
        self.policy = policy
        self.setups = setups
        self.group_size = group_size
        self.config = config
        self.backend = backend
        self.model_name_or_path = model_name_or_path
        # Resolved once: validating the options looks the backend up among the installed
        # entry points, which costs milliseconds per call.
        self.sandbox_options = sandbox_options or config.sandbox.options_for(backend)

    def __enter__(self) -> InProcessEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def alive(self) -> int:
        """Sandboxes of the backend open in this process (``sandboxes.base.live_sandboxes``)."""
        return live_sandboxes(self.backend)

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        return await run_episode(
            row,
            self.policy,
            self.config,
            sample=sample,
            backend=self.backend,
            model_name_or_path=self.model_name_or_path,
            sandbox_options=self.sandbox_options,
            setups=self.setups,
            group_size=self.group_size,
        )

    async def gauges(self) -> Gauges:
        return Gauges(starting=starting_gate().stats.starting, alive=self.alive)
