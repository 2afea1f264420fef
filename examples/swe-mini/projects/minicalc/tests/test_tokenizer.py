import pytest
from minicalc import CalcError
from minicalc.tokenizer import Token, tokenize


def test_integers_and_operators():
    assert tokenize("12+3") == [Token("num", "12"), Token("op", "+"), Token("num", "3")]


def test_decimal_number():
    assert tokenize("0.25") == [Token("num", "0.25")]


def test_whitespace_is_ignored():
    assert tokenize(" ( 1 *2 ) ") == tokenize("(1*2)")


def test_rejects_unknown_character():
    with pytest.raises(CalcError, match="unexpected character"):
        tokenize("1 $ 2")


def test_rejects_malformed_number():
    with pytest.raises(CalcError, match="malformed number"):
        tokenize("1.2.3")
