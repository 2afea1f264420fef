from ledger import Account, Money, statement


def test_statement_lists_entries_and_balance():
    account = Account("ada")
    account.deposit(Money(1000), memo="salary")
    account.withdraw(Money(250), memo="rent")
    assert statement(account, width=20).splitlines() == [
        "Statement for ada",
        "salary     10.00 EUR",
        "rent       -2.50 EUR",
        "balance     7.50 EUR",
    ]
