from datetime import date
from decimal import Decimal

import pytest

from bankledger import AccountType, Ledger, balance_sheet, income_statement, trial_balance


@pytest.fixture
def ledger():
    led = Ledger()
    led.open("Cash", AccountType.ASSET)
    led.open("Equipment", AccountType.ASSET)
    led.open("Credit Card", AccountType.LIABILITY)
    led.open("Owner Capital", AccountType.EQUITY)
    led.open("Consulting", AccountType.INCOME)
    led.open("Software", AccountType.EXPENSE)
    led.transfer(date(2024, 1, 1), "Owner investment", "Cash", "Owner Capital", 10000)
    led.transfer(date(2024, 1, 5), "Laptop", "Equipment", "Credit Card", "2499.99")
    led.transfer(date(2024, 1, 20), "Client A", "Cash", "Consulting", 4000)
    led.transfer(date(2024, 2, 3), "IDE licence", "Software", "Cash", "199.00")
    return led


def test_trial_balance_columns_agree(ledger):
    rows = trial_balance(ledger)
    assert sum(r[1] for r in rows) == sum(r[2] for r in rows) == Decimal("16499.99")
    assert ("Owner Capital", Decimal("0.00"), Decimal("10000.00")) in rows


def test_income_statement_period(ledger):
    january = income_statement(ledger, date(2024, 1, 1), date(2024, 1, 31))
    assert january.net_income == Decimal("4000.00")
    full = income_statement(ledger)
    assert full.total_expenses == Decimal("199.00")
    assert full.net_income == Decimal("3801.00")


def test_balance_sheet_balances(ledger):
    sheet = balance_sheet(ledger)
    assert sheet.total_assets == Decimal("16300.99")
    assert sheet.total_liabilities == Decimal("2499.99")
    assert sheet.equity == {"Owner Capital": Decimal("10000.00")}
    assert sheet.retained_earnings == Decimal("3801.00")
    assert sheet.is_balanced


def test_balance_sheet_as_of(ledger):
    sheet = balance_sheet(ledger, as_of=date(2024, 1, 10))
    assert sheet.total_assets == Decimal("12499.99")
    assert sheet.total_equity == Decimal("10000.00")
    assert sheet.is_balanced
