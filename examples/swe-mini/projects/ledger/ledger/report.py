"""Plain-text account statements."""

from ledger.account import Account


def statement(account: Account, width: int = 32) -> str:
    """Return one line per entry and a closing balance line, amounts right-aligned."""
    lines = [f"Statement for {account.owner}"]
    for memo, amount in account.entries:
        lines.append(_row(memo, str(amount), width))
    lines.append(_row("balance", str(account.balance), width))
    return "\n".join(lines)


def _row(label: str, value: str, width: int) -> str:
    return label + value.rjust(width - len(label))
