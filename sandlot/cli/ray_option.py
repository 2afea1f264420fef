"""``--ray`` of ``sandlot eval`` and ``sandlot data selftest``: the evaluations on the actors of
a Ray cluster (:class:`~sandlot.rewards.ray_evaluator.RayEvaluator`), the run on this
machine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import click

from sandlot.cli.exit_codes import InputError
from sandlot.rewards.ray_evaluator import RayClusterError, RayEvaluator

ray_option = click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Run the evaluations on a Ray cluster ($RAY_ADDRESS, else the local one: ray start "
    "--head), spread over its nodes; logs and reports are written here, as without --ray.",
)


@contextlib.asynccontextmanager
async def ray_evaluator(
    use_ray: bool, backend: str, timeout: float | None, workers: int
) -> AsyncIterator[RayEvaluator | None]:
    """A started :class:`RayEvaluator` with ``use_ray``, else ``None`` (this process).

    Raises:
        InputError: no Ray cluster, or ``ray`` is not installed.
    """
    if not use_ray:
        yield None
        return
    evaluator = RayEvaluator(backend=backend, timeout=timeout, workers=workers)
    try:
        await evaluator.__aenter__()
    except (RayClusterError, ImportError) as exc:
        raise InputError(str(exc)) from None
    try:
        yield evaluator
    finally:
        await evaluator.__aexit__(None, None, None)
