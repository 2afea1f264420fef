"""minicalc: evaluate arithmetic expressions such as ``"2 * (3 + 4)"``."""

from minicalc.errors import CalcError
from minicalc.evaluator import evaluate

__all__ = ["CalcError", "evaluate"]
