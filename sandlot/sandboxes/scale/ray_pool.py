"""A pool of Ray actors spread over a cluster, as ``sandlot eval --ray``
(:class:`~sandlot.rewards.ray_evaluator.RayEvaluator`) and ``sandlot rollout --ray``
(:class:`~sandlot.rollout.ray_episodes.RayEpisodes`) run their work: joining the cluster,
one actor per CPU of it, the least loaded one chosen, a cancelled call cancelled on its actor,
every actor closed and killed at the end.

Written against Ray 2.x (``ray.init``, ``ray.remote(...).options(num_cpus=,
max_concurrency=, scheduling_strategy="SPREAD", runtime_env=)``, awaiting ``ObjectRef`` in
asyncio, ``ray.cancel``, ``ray.kill``; https://docs.ray.io/en/latest/ray-core/actors.html).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import anyio

from sandlot._optional import require
from sandlot.sandboxes.labels import forwarded_env

# How long a cancelled call gets to close its sandboxes before the driver moves on
# (Sandbox.close's own budget is 60 s).
CANCEL_WAIT_S = 75.0


class RayActorPool:
    """Actors of one worker class across a Ray cluster, and the calls made to them.

    ``start`` connects to the cluster at its ``address`` (default: ``$RAY_ADDRESS``, else
    ``"auto"``) unless Ray is already initialised in this process (then ``close`` leaves it
    running), and starts one actor per CPU of the cluster (at most ``wanted``), spread over
    its nodes, each taking ``ceil(wanted / actors)`` calls at once and 4 more (the callers'
    other calls: set-up, gauges, close). The run id and the ``SANDLOT_*`` settings
    (:func:`~sandlot.sandboxes.labels.forwarded_env`) go to each actor's environment and to
    its constructor as ``env``, so its sandboxes are labelled as on the driver. A worker class
    has ``close() -> int``: it waits for its cancelled calls to close their sandboxes, then
    returns the sandboxes still open.

    Args:
        error: builds the error raised when no cluster answers, from its message (which names
            the address and how to start a cluster).
        log: where a failed close of an actor is logged (a warning).
        actor_name: the actor in that warning, e.g. ``"a rollout actor"``.

    Attributes:
        ray: the ``ray`` module, once started.
        actors: the actors' handles (empty before ``start`` and after ``close``).
    """

    def __init__(
        self, *, error: Callable[[str], Exception], log: logging.Logger, actor_name: str
    ) -> None:
        self._error = error
        self._log = log
        self._actor_name = actor_name
        self.ray: Any = None
        self.actors: list[Any] = []
        self._load: list[int] = []
        self._owns_ray = False

    def start(
        self, worker: type, *args: Any, wanted: int, address: str | None, **options: Any
    ) -> None:
        """Join the cluster and start the actors: ``worker(*args, env=<forwarded env>)``,
        with Ray actor ``options`` (such as ``max_restarts``) added to the pool's own.

        Args:
            worker: the actor's class (plain Python; wrapped with ``ray.remote`` here).
            args: its constructor's positional arguments (picklable).
            wanted: calls at once across the cluster (>= 1).
            address: the Ray cluster (``None``: ``$RAY_ADDRESS``, else ``"auto"``).
            options: more ``.options()`` of the actors, e.g. ``max_restarts=2``.

        Raises:
            Exception: ``error``'s, no cluster at the address.
            BackendUnavailableError: ``ray`` is not installed (names the extra).
        """
        ray = self.ray = require("ray", "train")
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or "auto"
            try:
                ray.init(address=address, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise self._error(
                    f"no Ray cluster at {address!r} ({exc}); start one with `ray start --head` "
                    "or set RAY_ADDRESS"
                ) from None
            self._owns_ray = True
        env = forwarded_env()
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        count = max(1, min(wanted, cpus))
        per_actor = math.ceil(wanted / count)
        remote_cls = ray.remote(worker)
        self.actors = [
            remote_cls.options(
                num_cpus=0,
                max_concurrency=per_actor + 4,
                scheduling_strategy="SPREAD",
                runtime_env={"env_vars": env},
                **options,
            ).remote(*args, env=env)
            for _ in range(count)
        ]
        self._load = [0] * count

    async def close(self) -> int:
        """Close every actor at once (a dead one is logged: its sandboxes died with it), kill
        them, and shut Ray down if ``start`` initialised it; shielded from cancellation.
        Returns the sandboxes the actors still had open."""
        left_open = 0

        async def close(actor: Any) -> None:
            nonlocal left_open
            try:
                left_open += await actor.close.remote()
            except Exception as exc:  # a dead actor: its sandboxes died with it
                self._log.warning("closing %s failed: %s", self._actor_name, exc)
            with contextlib.suppress(Exception):
                self.ray.kill(actor)

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for actor in self.actors:
                    tg.start_soon(close, actor)
            self.actors = []
            if self._owns_ray:
                self.ray.shutdown()
                self._owns_ray = False
        return left_open

    def least_loaded(self) -> int:
        """The index of the actor with the fewest calls running."""
        return min(range(len(self.actors)), key=self._load.__getitem__)

    async def call(self, i: int, method: str, *args: Any) -> Any:
        """``actors[i].<method>(*args)``'s result, counted in the actor's load while it runs.
        Cancelling cancels the actor's task (``ray.cancel``) and waits (shielded, at most
        :data:`CANCEL_WAIT_S` seconds) for it to end.

        Raises:
            ray.exceptions.RayError: the actor, its node or the call failed.
        """
        self._load[i] += 1
        ref = getattr(self.actors[i], method).remote(*args)
        try:
            return await ref
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                self.ray.cancel(ref)
                with anyio.move_on_after(CANCEL_WAIT_S), contextlib.suppress(Exception):
                    await ref
            raise
        finally:
            self._load[i] -= 1
