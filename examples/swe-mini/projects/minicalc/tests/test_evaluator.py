import pytest
from minicalc import CalcError, evaluate


def test_addition():
    assert evaluate("1 + 2") == 3


def test_precedence():
    assert evaluate("2 + 3 * 4") == 14


def test_parentheses():
    assert evaluate("(2 + 3) * 4") == 20


def test_subtraction_is_left_associative():
    assert evaluate("10 - 4 - 3") == 3


def test_division():
    assert evaluate("8 / 2") == 4


def test_division_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        evaluate("1 / (2 - 2)")


def test_decimal_arithmetic():
    assert evaluate("0.5 * 4") == 2


def test_unbalanced_parentheses():
    with pytest.raises(CalcError):
        evaluate("(1 + 2")


def test_trailing_tokens_rejected():
    with pytest.raises(CalcError, match="after the expression"):
        evaluate("1 2")
