"""Where ``sandlot eval``'s evaluations run: :class:`Evaluator` is what
:func:`~sandlot.rewards.runner.run_evaluations` calls for each one, :class:`InProcessEvaluator`
runs them in this process (:mod:`sandlot.rewards.ray_evaluator` on a Ray cluster)."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalResult
from sandlot.sandboxes.setups.cache import SetupCache


class Evaluator(Protocol):
    """Runs evaluations (one event loop's worth of them at once) and says how many set-ups
    they took. Use as an async context manager."""

    async def evaluate(
        self, instance: Instance, prediction: Prediction, *, group_size: int, test_empty: bool
    ) -> EvalResult:
        """:func:`~sandlot.rewards.evaluation.evaluate` of ``prediction`` on ``instance``
        (``group_size``: how many evaluations of the instance share its set-up; ``test_empty``: as
        ``evaluate``'s). Never raises but for cancellation."""
        ...

    async def set_ups(self) -> int | None:
        """Sandboxes set up so far when evaluations share set-ups (``None``: each evaluation
        set up its own)."""
        ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...


class InProcessEvaluator:
    """Evaluations in this process's event loop.

    Args:
        backend: sandbox backend name (``None``: as ``choose_backend`` chooses).
        timeout: seconds for each test command (``None``: each instance's ``eval_timeout``).
        sandbox_options: backend-specific options.
        share_setups: the evaluations of an instance run in forks of one set-up
            (:class:`~sandlot.sandboxes.setups.cache.SetupCache` with ``fork_first``; a
            snapshot that fails falls back to one set-up per evaluation).
    """

    def __init__(
        self,
        *,
        backend: str | None = None,
        timeout: float | None = None,
        sandbox_options: BaseModel | dict[str, Any] | None = None,
        share_setups: bool = False,
    ) -> None:
        self.backend = backend
        self.timeout = timeout
        self.sandbox_options = sandbox_options
        self._setups = SetupCache() if share_setups else None

    async def __aenter__(self) -> InProcessEvaluator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._setups is not None:
            await self._setups.aclose()

    async def evaluate(
        self, instance: Instance, prediction: Prediction, *, group_size: int, test_empty: bool
    ) -> EvalResult:
        return await evaluate(
            instance,
            prediction.model_patch,
            backend=self.backend,
            model_name_or_path=prediction.model_name_or_path,
            timeout=self.timeout,
            sandbox_options=self.sandbox_options,
            setups=self._setups,
            group_size=group_size,
            test_empty=test_empty,
        )

    async def set_ups(self) -> int | None:
        return self._setups.counts.set_up if self._setups is not None else None
