from datetime import date
from decimal import Decimal

import pytest

from bankledger import AccountType, Entry, Ledger, LedgerError, to_money


@pytest.fixture
def ledger():
    led = Ledger()
    led.open("Cash", AccountType.ASSET)
    led.open("Bank Loan", AccountType.LIABILITY)
    led.open("Sales", AccountType.INCOME)
    led.open("Rent", AccountType.EXPENSE)
    led.transfer(date(2024, 1, 2), "Loan drawn", "Cash", "Bank Loan", "5000")
    led.transfer(date(2024, 1, 10), "Invoice #1 paid", "Cash", "Sales", "1200.50")
    led.transfer(date(2024, 2, 1), "February rent", "Rent", "Cash", 800)
    return led


def test_to_money():
    assert to_money("10.005") == Decimal("10.01")
    assert to_money(3) == Decimal("3.00")
    with pytest.raises(TypeError):
        to_money(0.1)


def test_unbalanced_transaction_rejected(ledger):
    with pytest.raises(LedgerError):
        ledger.post(date(2024, 3, 1), "oops", [Entry.dr("Cash", 10), Entry.cr("Sales", 9)])
    with pytest.raises(LedgerError):
        ledger.post(date(2024, 3, 1), "single", [Entry.dr("Cash", 10)])
    assert len(ledger.transactions) == 3


def test_unknown_account_rejected(ledger):
    with pytest.raises(LedgerError):
        ledger.transfer(date(2024, 3, 1), "x", "Cash", "Nope", 1)
    with pytest.raises(LedgerError):
        ledger.open("Cash", AccountType.ASSET)


def test_asset_and_expense_balances_are_debit_positive(ledger):
    assert ledger.balance("Cash") == Decimal("5400.50")
    assert ledger.balance("Rent") == Decimal("800.00")


def test_liability_and_income_balances_are_credit_positive(ledger):
    assert ledger.balance("Bank Loan") == Decimal("5000.00")
    assert ledger.balance("Sales") == Decimal("1200.50")


def test_balance_as_of_and_since(ledger):
    assert ledger.balance("Cash", as_of=date(2024, 1, 31)) == Decimal("6200.50")
    assert ledger.balance("Cash", since=date(2024, 2, 1)) == Decimal("-800.00")


def test_statement_running_balance(ledger):
    lines = ledger.statement("Cash", start=date(2024, 1, 5))
    assert [(l.description, l.balance) for l in lines] == [
        ("Invoice #1 paid", Decimal("6200.50")),
        ("February rent", Decimal("5400.50")),
    ]
    loan = ledger.statement("Bank Loan")
    assert [l.balance for l in loan] == [Decimal("5000.00")]
