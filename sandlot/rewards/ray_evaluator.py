"""Evaluations on a Ray cluster (``sandlot eval --ray``, ``sandlot data selftest --ray``):
:class:`RayEvaluator` keeps the run (its queue, files and reports) on the driver and sends
each evaluation to one of a pool of actors (:class:`EvalWorker`), spread over the nodes. All
the evaluations of an instance go to one actor, whose own
:class:`~sandlot.sandboxes.setups.cache.SetupCache` sets the instance up once for them, so the
results and reports are those of one machine."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import anyio

from sandlot._optional import require
from sandlot.datasets.instance import Instance
from sandlot.errors import SandlotError
from sandlot.rewards.evaluators import InProcessEvaluator
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalFailure, EvalResult, EvalStatus
from sandlot.sandboxes.base import live_sandboxes
from sandlot.sandboxes.labels import forwarded_env

log = logging.getLogger("sandlot.rewards")

_CANCEL_WAIT_S = 75.0  # a cancelled evaluation's time to close its sandboxes (close: 60 s)


class RayClusterError(SandlotError, ConnectionError):
    """No Ray cluster could be joined (the message names the address and how to start one)."""


class EvalWorker:
    """One Ray actor of :class:`RayEvaluator`: an event loop evaluating in its own sandboxes,
    its instances' set-ups shared. Plain Python (wrapped with ``ray.remote`` by the driver),
    so it can also be tested without Ray."""

    def __init__(self, backend: str, timeout: float | None, env: Mapping[str, str]) -> None:
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

    async def close(self, wait_s: float = _CANCEL_WAIT_S) -> int:
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
        self.backend = backend
        self.timeout = timeout
        self.workers = workers
        self.address = address
        self.actors: list[Any] = []
        self.left_open = 0
        self._load: list[int] = []
        self._home: dict[str, int] = {}
        self._ray: Any = None
        self._owns_ray = False

    async def __aenter__(self) -> RayEvaluator:
        """Join the cluster and start the actors.

        Raises:
            RayClusterError: no cluster at the address.
            ImportError: ``ray`` is not installed (names the extra).
        """
        ray = self._ray = require("ray", "train")
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS") or "auto"
            try:
                ray.init(address=address, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayClusterError(
                    f"no Ray cluster at {address!r} ({exc}); start one with `ray start --head` "
                    "or set RAY_ADDRESS"
                ) from None
            self._owns_ray = True
        env = forwarded_env()
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        count = max(1, min(self.workers, cpus))
        per_actor = math.ceil(self.workers / count)
        remote_cls = ray.remote(EvalWorker)
        self.actors = [
            remote_cls.options(
                num_cpus=0,
                max_concurrency=per_actor + 4,  # + set_ups and close calls
                scheduling_strategy="SPREAD",
                runtime_env={"env_vars": env},
            ).remote(self.backend, self.timeout, env)
            for _ in range(count)
        ]
        self._load = [0] * count
        return self

    async def __aexit__(self, *exc: object) -> None:
        ray = self._ray

        async def close(actor: Any) -> None:
            try:
                self.left_open += await actor.close.remote()
            except Exception as exc:  # a dead actor: its sandboxes died with it
                log.warning("closing an evaluation actor failed: %s", exc)
            with contextlib.suppress(Exception):
                ray.kill(actor)

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for actor in self.actors:
                    tg.start_soon(close, actor)
            self.actors = []
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False

    async def evaluate(
        self, instance: Instance, prediction: Prediction, *, group_size: int, test_empty: bool
    ) -> EvalResult:
        """The evaluation, on the actor that holds ``instance``'s set-up (the least loaded one
        for its first evaluation). A lost actor or node is an ``error`` result with failure
        ``infrastructure``; cancelling cancels the actor's task (its sandboxes close)."""
        ray = self._ray
        iid = instance.instance_id
        i = self._home.get(iid)
        if i is None:
            i = self._home[iid] = min(range(len(self.actors)), key=self._load.__getitem__)
        self._load[i] += 1
        ref = self.actors[i].evaluate.remote(instance, prediction, group_size, test_empty)
        try:
            result: EvalResult = await ref
            return result
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                ray.cancel(ref)
                with anyio.move_on_after(_CANCEL_WAIT_S), contextlib.suppress(Exception):
                    await ref
            raise
        except ray.exceptions.RayError as exc:
            return EvalResult(
                instance_id=iid,
                model_name_or_path=prediction.model_name_or_path,
                status=EvalStatus.ERROR,
                error=f"ray: {type(exc).__name__}: {exc}",
                failure=EvalFailure.INFRASTRUCTURE,
            )
        finally:
            self._load[i] -= 1

    async def set_ups(self) -> int | None:
        """The actors' set-ups, summed."""
        counts = [await actor.set_ups.remote() for actor in self.actors]
        return sum(c or 0 for c in counts)
