"""Errors raised by minicalc."""


class CalcError(ValueError):
    """The expression cannot be tokenized, parsed or evaluated."""
