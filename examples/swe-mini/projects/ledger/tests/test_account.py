import pytest
from ledger import Account, InsufficientFundsError, Money


def test_deposit_and_withdraw():
    account = Account("ada")
    account.deposit(Money(1000))
    account.withdraw(Money(250))
    assert account.balance == Money(750)


def test_overdraft_rejected():
    account = Account("ada")
    account.deposit(Money(100))
    with pytest.raises(InsufficientFundsError):
        account.withdraw(Money(101))


def test_non_positive_deposit_rejected():
    with pytest.raises(ValueError):
        Account("ada").deposit(Money(0))
