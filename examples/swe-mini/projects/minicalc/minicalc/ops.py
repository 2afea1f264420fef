"""Binary operators: symbol -> (precedence, function)."""

import operator

from minicalc.errors import CalcError


def divide(a: float, b: float) -> float:
    """Divide ``a`` by ``b``; dividing by zero raises :class:`CalcError`."""
    if b == 0:
        raise CalcError("division by zero")
    return a // b


BINARY_OPS = {
    "+": (1, operator.add),
    "-": (1, operator.sub),
    "*": (2, operator.mul),
    "/": (2, divide),
}
