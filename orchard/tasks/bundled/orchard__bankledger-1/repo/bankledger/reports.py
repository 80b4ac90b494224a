"""Financial reports computed from a :class:`~bankledger.ledger.Ledger`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Optional

from .accounts import AccountType
from .ledger import Ledger

ZERO = Decimal("0.00")


def trial_balance(ledger: Ledger, as_of: Optional[date] = None) -> list[tuple[str, Decimal, Decimal]]:
    """``(account, debit, credit)`` rows; each account's net goes in one column.

    The debit and credit columns always have equal totals.
    """
    rows = []
    for name in sorted(ledger.accounts):
        net = ZERO
        for _, entry in ledger._entries(name, None, as_of):
            net += entry.debit - entry.credit
        if net >= 0:
            rows.append((name, net, ZERO))
        else:
            rows.append((name, ZERO, -net))
    return rows


@dataclass(frozen=True)
class IncomeStatement:
    income: dict[str, Decimal]
    expenses: dict[str, Decimal]

    @property
    def total_income(self) -> Decimal:
        return sum(self.income.values(), ZERO)

    @property
    def total_expenses(self) -> Decimal:
        return sum(self.expenses.values(), ZERO)

    @property
    def net_income(self) -> Decimal:
        return self.total_income - self.total_expenses


def _of_type(ledger: Ledger, type: AccountType) -> list[str]:
    return sorted(name for name, acc in ledger.accounts.items() if acc.type is type)


def income_statement(ledger: Ledger, start: Optional[date] = None,
                     end: Optional[date] = None) -> IncomeStatement:
    """Income and expense account balances for the period ``start``..``end``."""
    return IncomeStatement(
        income={n: ledger.balance(n, end, start) for n in _of_type(ledger, AccountType.INCOME)},
        expenses={n: ledger.balance(n, end, start) for n in _of_type(ledger, AccountType.EXPENSE)},
    )


@dataclass(frozen=True)
class BalanceSheet:
    assets: dict[str, Decimal]
    liabilities: dict[str, Decimal]
    equity: dict[str, Decimal]
    retained_earnings: Decimal

    @property
    def total_assets(self) -> Decimal:
        return sum(self.assets.values(), ZERO)

    @property
    def total_liabilities(self) -> Decimal:
        return sum(self.liabilities.values(), ZERO)

    @property
    def total_equity(self) -> Decimal:
        return sum(self.equity.values(), ZERO) + self.retained_earnings

    @property
    def is_balanced(self) -> bool:
        return self.total_assets == self.total_liabilities + self.total_equity


def balance_sheet(ledger: Ledger, as_of: Optional[date] = None) -> BalanceSheet:
    """Assets, liabilities and equity as of ``as_of``.

    Income and expenses not yet closed into equity appear as retained earnings.
    """
    return BalanceSheet(
        assets={n: ledger.balance(n, as_of) for n in _of_type(ledger, AccountType.ASSET)},
        liabilities={n: ledger.balance(n, as_of)
                     for n in _of_type(ledger, AccountType.LIABILITY)},
        # equity accounts come back debit-positive; flip them for presentation
        equity={n: -ledger.balance(n, as_of) for n in _of_type(ledger, AccountType.EQUITY)},
        retained_earnings=income_statement(ledger, None, as_of).net_income,
    )
