"""ledger: money amounts, accounts and statements."""

from ledger.account import Account, InsufficientFundsError
from ledger.money import Money
from ledger.report import statement

__all__ = ["Account", "InsufficientFundsError", "Money", "statement"]
