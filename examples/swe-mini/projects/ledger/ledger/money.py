"""Money amounts held as integer cents."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Money:
    cents: int
    currency: str = "EUR"

    @classmethod
    def parse(cls, text: str) -> Money:
        """Parse ``"12.50 USD"``, or ``"12.50"`` in euros, into ``Money(1250, "USD")``."""
        amount, _, currency = text.strip().partition(" ")
        negative = amount.startswith("-")
        whole, _, frac = amount.removeprefix("-").partition(".")
        if not whole.isdigit() or len(frac) > 2 or (frac and not frac.isdigit()):
            raise ValueError(f"not a money amount: {text!r}")
        cents = int(whole) * 100 + int(frac or 0)
        return cls(-cents if negative else cents, currency or "EUR")

    def __add__(self, other: Money) -> Money:
        return Money(self.cents + other.cents, self.currency)

    def __neg__(self) -> Money:
        return Money(-self.cents, self.currency)

    def __str__(self) -> str:
        sign = "-" if self.cents < 0 else ""
        whole, frac = divmod(abs(self.cents), 100)
        return f"{sign}{whole}.{frac:02d} {self.currency}"
