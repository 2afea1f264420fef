"""Episodes on a Ray cluster: :class:`RayEpisodes` keeps the scheduler on the driver and runs
each episode on one of a pool of actors (:class:`EpisodeWorker`: one asyncio loop and one
model client each), streaming results back for the driver to append as they finish.
Cancelling an episode cancels its actor task (``ray.cancel``), which closes its sandboxes as
in-process cancellation does."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from pydantic import BaseModel

from sandlot.datasets.rows import TaskRow
from sandlot.rollout.agent import run_episode
from sandlot.rollout.config import AgentConfig
from sandlot.rollout.episodes import Gauges, infra_error_trajectory
from sandlot.rollout.errors import RolloutError
from sandlot.rollout.policy import Policy
from sandlot.rollout.trajectory import Trajectory
from sandlot.sandboxes.base import live_sandboxes
from sandlot.sandboxes.scale.ray_pool import CANCEL_WAIT_S, RayActorPool
from sandlot.sandboxes.scale.starting import starting_gate
from sandlot.sandboxes.setups.actor import SharedSetups
from sandlot.sandboxes.setups.cache import SetupCache

log = logging.getLogger("sandlot.rollout")


class EpisodeWorker:
    """One Ray actor of :class:`RayEpisodes`: its own event loop, model client and sandboxes.

    Plain Python (wrapped with ``ray.remote`` by the driver), so it can also be tested
    without Ray.
    """

    def __init__(
        self,
        policy_factory: Callable[[], Policy],
        config: AgentConfig,
        backend: str,
        model_name_or_path: str,
        group_size: int = 1,
        *,
        env: Mapping[str, str],
    ) -> None:
        os.environ.update(env)
        # One line per model request would flood the driver's console (log_to_driver).
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self._factory = policy_factory
        self._config = config
        self._backend = backend
        self._options: BaseModel | None = None
        self._model = model_name_or_path
        self._stack = contextlib.AsyncExitStack()
        self._policy: Policy | None = None
        self._running = 0
        # The samples of a row, on any actor of the node (or cluster), share one set-up.
        self._group_size = group_size
        self._setups = SetupCache(shared=SharedSetups()) if group_size > 1 else None

    async def setup(self) -> None:
        """Create the policy (entering it when it is an async context manager)."""
        if self._policy is not None:
            return
        # The factory first: it may register the backend in this process.
        policy: Any = self._factory()
        if hasattr(policy, "__aenter__"):
            policy = await self._stack.enter_async_context(policy)
        self._options = self._config.sandbox.options_for(self._backend)
        self._policy = policy

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        """One episode (:func:`~sandlot.rollout.agent.run_episode`)."""
        await self.setup()
        assert self._policy is not None
        self._running += 1
        try:
            return await run_episode(
                row,
                self._policy,
                self._config,
                sample=sample,
                backend=self._backend,
                model_name_or_path=self._model,
                sandbox_options=self._options,
                setups=self._setups,
                group_size=self._group_size,
            )
        finally:
            self._running -= 1

    async def gauges(self) -> tuple[int, int]:
        """(sandboxes in STARTING, sandboxes open) in this actor."""
        return starting_gate().stats.starting, live_sandboxes(self._backend)

    async def close(self, wait_s: float = CANCEL_WAIT_S) -> int:
        """Wait (at most ``wait_s``) for cancelled episodes to close their sandboxes, then
        close the policy. Returns the sandboxes still open."""
        with anyio.move_on_after(wait_s):
            # Polled: the live count has no event to wait on, and this runs once per actor.
            while self._running or live_sandboxes(self._backend):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        if self._setups is not None:
            await self._setups.aclose()
        await self._stack.aclose()
        return live_sandboxes(self._backend)


class RayEpisodes:
    """Episodes run by a pool of Ray actors (:class:`EpisodeWorker`) across a cluster.

    Use as an async context manager. Connects to the cluster at ``address`` (default:
    ``$RAY_ADDRESS``, else ``"auto"``) unless Ray is already initialised in this process,
    and starts one actor per CPU of the cluster (at most ``concurrency``), spread over its
    nodes, each running up to ``ceil(concurrency / actors)`` episodes at once. Each actor
    builds its own policy with ``policy_factory`` (a picklable callable, e.g. a
    ``functools.partial`` of the client class). Sandboxes are labelled with this run's id
    (``SANDLOT_RUN_ID`` is forwarded), so ``sandlot gc --run-id`` finds what a dead run left.

    Args:
        policy_factory: builds the policy in each actor.
        config: the agent config.
        backend: the sandbox backend.
        model_name_or_path: recorded in trajectories.
        concurrency: episodes at once across the cluster.
        address: the Ray cluster.
        group_size: the samples of a row; above 1 they share one set-up for their agents and
            one for their gradings across the actors (:mod:`sandlot.sandboxes.setups.actor`:
            per node, or per cluster for backends whose snapshots any node opens).
    """

    def __init__(
        self,
        policy_factory: Callable[[], Policy],
        config: AgentConfig,
        *,
        backend: str,
        model_name_or_path: str = "",
        concurrency: int = 8,
        address: str | None = None,
        group_size: int = 1,
    ) -> None:
        self.policy_factory = policy_factory
        self.config = config
        self.backend = backend
        self.model_name_or_path = model_name_or_path
        self.concurrency = concurrency
        self.address = address
        self.group_size = group_size
        self.left_open = 0
        self._pool = RayActorPool(error=RolloutError, log=log, actor_name="a rollout actor")

    @property
    def actors(self) -> list[Any]:
        """The actors' handles (none before entering or after leaving)."""
        return self._pool.actors

    async def __aenter__(self) -> RayEpisodes:
        args = (self.policy_factory, self.config, self.backend, self.model_name_or_path)
        wanted, address = self.concurrency, self.address
        self._pool.start(
            EpisodeWorker, *args, self.group_size, wanted=wanted, address=address, max_restarts=2
        )
        try:
            for actor in self.actors:
                await actor.setup.remote()
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shutdown()

    async def _shutdown(self) -> None:
        self.left_open += await self._pool.close()

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        i = self._pool.least_loaded()
        try:
            traj: Trajectory = await self._pool.call(i, "run", row, sample)
            return traj
        except self._pool.ray.exceptions.RayError as exc:
            # A lost actor or node may not recur; an exception raised by the episode would.
            retryable = not isinstance(exc, self._pool.ray.exceptions.RayTaskError)
            error = f"ray: {type(exc).__name__}: {exc}"
            return infra_error_trajectory(row, sample, error, retryable=retryable)

    async def gauges(self) -> Gauges:
        starting = alive = 0
        for actor in self.actors:
            with contextlib.suppress(Exception):
                s, a = await actor.gauges.remote()
                starting += s
                alive += a
        return Gauges(starting=starting, alive=alive)
