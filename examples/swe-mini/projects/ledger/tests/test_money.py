import pytest
from ledger import Money


def test_parse_two_decimals():
    assert Money.parse("19.99 USD") == Money(1999, "USD")


def test_parse_whole_amount_defaults_to_euros():
    assert Money.parse("7") == Money(700, "EUR")


def test_parse_negative():
    assert Money.parse("-0.05") == Money(-5)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        Money.parse("12.345")


def test_add_same_currency():
    assert Money(150) + Money(275) == Money(425)


def test_str():
    assert str(Money(-1205, "USD")) == "-12.05 USD"
