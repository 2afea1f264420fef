"""Accounts: a list of signed entries in one currency."""

from __future__ import annotations

from ledger.money import Money


class InsufficientFundsError(Exception):
    """A withdrawal exceeds the balance."""


class Account:
    def __init__(self, owner: str, currency: str = "EUR") -> None:
        self.owner = owner
        self.currency = currency
        self.entries: list[tuple[str, Money]] = []

    @property
    def balance(self) -> Money:
        total = Money(0, self.currency)
        for _, amount in self.entries:
            total = total + amount
        return total

    def deposit(self, amount: Money, memo: str = "deposit") -> None:
        """Add a positive ``amount``."""
        if amount.cents <= 0:
            raise ValueError("a deposit must be positive")
        self.entries.append((memo, amount))

    def withdraw(self, amount: Money, memo: str = "withdrawal") -> None:
        """Take a positive ``amount`` out; raises :class:`InsufficientFundsError` on overdraft."""
        if amount.cents <= 0:
            raise ValueError("a withdrawal must be positive")
        if amount.cents > self.balance.cents:
            raise InsufficientFundsError(f"{self.owner} cannot withdraw {amount}")
        self.entries.append((memo, -amount))
