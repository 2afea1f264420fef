"""SWE-bench style rewards: test-patch evaluation, grading and ``sandlot eval``'s run.

``await sandlot.rewards.evaluate(instance, model_patch, backend="local")`` evaluates one patch in
a fresh sandbox and returns an :class:`~sandlot.rewards.result.EvalResult`; see
:mod:`sandlot.rewards.evaluation`.
"""

from sandlot.rewards.evaluation import evaluate, evaluate_in_sandbox
from sandlot.rewards.result import EvalResult

__all__ = ["EvalResult", "evaluate", "evaluate_in_sandbox"]
