"""Account types and their normal balance side."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DEBIT = "debit"
CREDIT = "credit"


class AccountType(Enum):
    ASSET = "asset"
    LIABILITY = "liability"
    EQUITY = "equity"
    INCOME = "income"
    EXPENSE = "expense"

    @property
    def normal_balance(self) -> str:
        """The side (:data:`DEBIT` or :data:`CREDIT`) that increases this type."""
        return _NORMAL_BALANCE[self]

    @property
    def is_balance_sheet(self) -> bool:
        return self in (AccountType.ASSET, AccountType.LIABILITY, AccountType.EQUITY)


# Assets and expenses grow with debits; liabilities, equity and income with credits.
_NORMAL_BALANCE = {
    AccountType.ASSET: DEBIT,
    AccountType.EXPENSE: DEBIT,
    AccountType.EQUITY: DEBIT,
    AccountType.LIABILITY: CREDIT,
    AccountType.INCOME: CREDIT,
}


@dataclass(frozen=True)
class Account:
    """A named account of a given :class:`AccountType`."""

    name: str
    type: AccountType

    @property
    def normal_balance(self) -> str:
        return self.type.normal_balance
