"""Evaluations on a Ray cluster (``sandlot eval --ray``, ``sandlot data selftest --ray``):
:class:`RayEvaluator` keeps the run (its queue, files and reports) on the driver and sends
each evaluation to one of a pool of actors (:class:`EvalWorker`), spread over the nodes. All
the evaluations of an instance go to one actor, whose own
:class:`~sandlot.sandboxes.setups.cache.SetupCache` sets the instance up once for them, so the
results and reports are those of one machine."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import anyio

from sandlot.datasets.instance import Instance
from sandlot.errors import SandlotError
from sandlot.rewards.evaluators import InProcessEvaluator
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalFailure, EvalResult, EvalStatus
from sandlot.sandboxes.base import live_sandboxes
from sandlot.sandboxes.scale.ray_pool import CANCEL_WAIT_S, RayActorPool

log = logging.getLogger("sandlot.rewards")


class RayClusterError(SandlotError, ConnectionError):
    """No Ray cluster could be joined (the message names the address and how to start one)."""


class EvalWorker:
    """One Ray actor of :class:`RayEvaluator`: an event loop evaluating in its own sandboxes,
    its instances' set-ups shared. Plain Python (wrapped with ``ray.remote`` by the driver),
    so it can also be tested without Ray."""

    def __init__(self, backend: str, timeout: float | None, *, env: Mapping[str, str]) -> None:
        os.environ.update(env)
        self._backend = backend
        self._evaluator = InProcessEvaluator(backend=backend, timeout=timeout, share_setups=True)

    async def evaluate(
        self, instance: Instance, prediction: Prediction, group_size: int, test_empty: bool
    ) -> EvalResult:
        return await self._evaluator.evaluate(
            instance, prediction, group_size=group_size, test_empty=test_empty
        )

    async def set_ups(self) -> int | None:
        return await self._evaluator.set_ups()

    async def close(self, wait_s: float = CANCEL_WAIT_S) -> int:
        """Wait (at most ``wait_s``) for cancelled evaluations to close their sandboxes, then
        delete the set-ups' snapshots. Returns the sandboxes still open."""
        with anyio.move_on_after(wait_s):
            # Polled: the live count has no event to wait on, and this runs once per actor.
            while live_sandboxes(self._backend):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        await self._evaluator.__aexit__(None, None, None)
        return live_sandboxes(self._backend)


class RayEvaluator:
    """Evaluations run by a pool of Ray actors (:class:`EvalWorker`) across a cluster; an
    :class:`~sandlot.rewards.evaluators.Evaluator`.

    Use as an async context manager. Connects to the cluster at ``address`` (default:
    ``$RAY_ADDRESS``, else ``"auto"``) unless Ray is already initialised in this process, and
    starts one actor per CPU of the cluster (at most ``workers``), spread over its nodes, each
    running up to ``ceil(workers / actors)`` evaluations at once. The run id and the
    ``SANDLOT_*`` settings are forwarded, so sandboxes are labelled as on the driver. Each
    node's sandboxes, environments and caches are its own: a ``repo_source`` that is a host
    path must exist on every node (or use a URL, or ``--repo-mirror`` on a shared path).

    Args:
        backend: the sandbox backend.
        timeout: seconds for each test command (``None``: each instance's ``eval_timeout``).
        workers: evaluations at once across the cluster.
        address: the Ray cluster.

    Attributes:
        left_open: sandboxes the actors still had open when closed.
    """

    def __init__(
        self, *, backend: str, timeout: float | None, workers: int, address: str | None = None
    ) -> None:
        self._pool = RayActorPool(error=RayClusterError, log=log, actor_name="an evaluation actor")
        self.left_open = 0
        self.backend = backend
        self.timeout = timeout
        self.workers = workers
        self.address = address
        self._home: dict[str, int] = {}

    @property
    def actors(self) -> list[Any]:
        """The actors' handles (none before entering or after leaving)."""
        return self._pool.actors

    async def __aenter__(self) -> RayEvaluator:
        """Join the cluster and start the actors.

        Raises:
            RayClusterError: no cluster at the address.
            BackendUnavailableError: ``ray`` is not installed (names the extra).
        """
        args = (self.backend, self.timeout)
        self._pool.start(EvalWorker, *args, wanted=self.workers, address=self.address)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.left_open += await self._pool.close()

    async def evaluate(
        self, instance: Instance, prediction: Prediction, *, group_size: int, test_empty: bool
    ) -> EvalResult:
        """The evaluation, on the actor that holds ``instance``'s set-up (the least loaded one
        for its first evaluation). A lost actor or node is an ``error`` result with failure
        ``infrastructure``; cancelling cancels the actor's task (its sandboxes close)."""
        iid = instance.instance_id
        i = self._home.get(iid)
        if i is None:
            i = self._home[iid] = self._pool.least_loaded()
        args = (instance, prediction, group_size, test_empty)
        try:
            result: EvalResult = await self._pool.call(i, "evaluate", *args)
            return result
        except self._pool.ray.exceptions.RayError as exc:
            return EvalResult(
                instance_id=iid,
                model_name_or_path=prediction.model_name_or_path,
                status=EvalStatus.ERROR,
                error=f"ray: {type(exc).__name__}: {exc}",
                failure=EvalFailure.INFRASTRUCTURE,
            )

    async def set_ups(self) -> int | None:
        """The actors' set-ups, summed."""
        counts = [await actor.set_ups.remote() for actor in self.actors]
        return sum(c or 0 for c in counts)
